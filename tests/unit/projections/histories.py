"""A Hypothesis strategy for random *valid* run histories, built through the real domain.

Each example opens a run, then drives ``decide`` with random commands from a few workers and a
store clock that jumps (so leases expire and ownership moves). Every submission goes through
``History.record`` (decide -> seal -> apply); a rejected one is dropped, so the log holds only
accepted events, exactly as the ledger would store them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

from hypothesis import strategies as st

from baton.domain import errors
from baton.domain.budgets import Ceilings, Usage
from baton.domain.commands import (
    AcquireLease,
    Command,
    CompleteRun,
    DeleteThread,
    ExpireLease,
    FailRun,
    HideCheckpoints,
    PruneThread,
    PurgeThread,
    PutCheckpoint,
    PutWrites,
    ReconcileIntent,
    RecordIntent,
    RecordObservation,
    RecordTransition,
    ReleaseLease,
    RenewLease,
    SealCheckpoint,
)
from baton.domain.events import BlobRef, ChannelWrite, FailureReason, IntentContext, Placement, RecordedEvent
from baton.domain.stages import Stage, is_legal
from baton.domain.state import RunState, intended_ops

from ..domain.given import W1, W2, W3, given, seconds

__all__ = ["WORKERS", "histories"]

T = TypeVar("T")
WORKERS = (W1, W2, W3)
CONTRACTS = ("shell@1", "http@2")
ARGUMENTS: tuple[dict[str, Any], ...] = ({"k": "v"}, {"n": 1, "s": "é"}, {"path": "/tmp/x", "lines": [1, 2]})
RESULTS: tuple[Any, ...] = (None, "ok", {"rows": [1, 2, 3]})
# Mostly small steps; 31 s outlives the default 30 s lease, so takeovers and expiries happen.
CLOCK_STEPS = st.sampled_from([0, 0, 0, seconds(1), seconds(5), seconds(31)])
# Rare terminal moves, so that most histories stay open and keep growing.
MOVES = (
    ["acquire"] * 4
    + ["renew"] * 2
    + ["release", "expire"]
    + ["intent"] * 20
    + ["observe"] * 20
    + ["reconcile"] * 8
    + ["transition"] * 12
    + ["seal"] * 4
    + ["checkpoint"] * 4  # a LangGraph thread's work (adapters/langgraph)
    + ["writes"] * 3
    + ["hide", "prune", "delete_thread"]
    + ["complete", "fail"]
)
PURGE_CHANCE = st.integers(0, 19)  # a purge by any worker, also on an ended run: about one step in twenty
DOCUMENT = BlobRef("sha256:" + "cd" * 32, 64, "blob://checkpoint")
OUTCOMES: tuple[tuple[Literal["ok", "failed"], FailureReason | None], ...] = (
    ("ok", None),
    ("ok", None),
    ("failed", "timeout"),
)
RESOLUTIONS: tuple[Literal["applied", "not_applied", "abandoned"], ...] = ("applied", "not_applied", "abandoned")
ceilings = st.sampled_from([Ceilings(), Ceilings(), Ceilings(calls=6), Ceilings(fuel=40, result_bytes=200)])
KINDS: tuple[Literal["effect", "pure"], ...] = ("effect", "effect", "pure")

# Strategies are built once here rather than once per draw.
_INDEX = tuple(st.integers(0, n - 1) if n else st.nothing() for n in range(64))
_MOVE, _FUEL, _COST = st.sampled_from(MOVES), st.integers(0, 9), st.integers(0, 3)


def _pick(draw: st.DrawFn, pool: Sequence[T]) -> T:
    """One item of ``pool`` (at most 63 items; they are few: ops, stages, workers)."""
    return pool[draw(_INDEX[len(pool)])]


def _placement(worker: str) -> Placement:
    return Placement(worker, model="m-1", provider="p-1", capabilities=("gpu",), tool_contracts=CONTRACTS)


def _intent(draw: st.DrawFn, state: RunState) -> RecordIntent:
    op_id = f"op-{len(intended_ops(state)) + _pick(draw, (0, 1))}"  # ids skip now and then, so some collide: refused
    context = IntentContext(1, op_id, effect="write", arguments=_pick(draw, ARGUMENTS))
    return RecordIntent(op_id, _pick(draw, KINDS), _pick(draw, CONTRACTS), context, f"idem-{op_id}")


def _command(draw: st.DrawFn, state: RunState, worker: str) -> Command:  # noqa: PLR0911
    move = draw(_MOVE)
    uncertain = sorted(state.operations)
    if move == "acquire":
        return AcquireLease(_placement(worker))
    if move == "renew":
        return RenewLease()
    if move == "release":
        return ReleaseLease()
    if move == "expire":
        return ExpireLease()
    if move == "intent" or (move in {"observe", "reconcile"} and not uncertain):
        return _intent(draw, state)
    if move == "observe":
        op = state.operations[_pick(draw, uncertain)]
        outcome, reason = _pick(draw, OUTCOMES)
        usage = Usage(fuel=draw(_FUEL), cost_micros=draw(_COST))
        return RecordObservation(op.op_id, op.context_digest, outcome, reason, _pick(draw, RESULTS), None, usage)
    if move == "reconcile":
        resolution = _pick(draw, RESOLUTIONS)
        return ReconcileIntent(_pick(draw, uncertain), resolution, "host log", _pick(draw, RESULTS))
    if move == "transition":
        legal = [stage for stage in Stage if is_legal(state.stage, stage)] or [Stage.GENERATING]
        return RecordTransition(_pick(draw, legal), f"sha256:s{state.version}")
    if move == "seal":
        return SealCheckpoint(f"c-{state.version}", f"sha256:s{state.version}")
    return _thread_command(move, state) or (CompleteRun("done") if move == "complete" else FailRun("gave_up"))


def _thread_command(move: str, state: RunState) -> Command | None:
    checkpoint_id = f"cp-{state.version}"
    if move == "checkpoint":
        return PutCheckpoint("", checkpoint_id, DOCUMENT, run_tag=f"r-{state.version % 3}")
    if move == "writes":
        return PutWrites("", checkpoint_id, "task-1", (ChannelWrite("messages", 0, "json", DOCUMENT),))
    if move == "hide":
        return HideCheckpoints((f"r-{state.version % 3}",))
    if move == "prune":
        return PruneThread("keep_latest")
    if move == "delete_thread":
        return DeleteThread("reset")
    return None


@st.composite
def histories(draw: st.DrawFn, min_steps: int = 5, max_steps: int = 40) -> list[RecordedEvent]:
    """The accepted events of one run driven by random commands from ``WORKERS``."""
    history = given().opened(draw(ceilings))
    for _ in range(draw(st.integers(min_steps, max_steps))):
        lease = history.state.lease
        worker = _pick(draw, WORKERS)
        command: Command
        if lease is None or history.now >= lease.expires_at:
            # mostly a takeover, sometimes a stray command that the fence must refuse
            command = _pick(draw, [AcquireLease(_placement(worker))] * 3 + [RenewLease()])
        else:
            worker = _pick(draw, [lease.worker] * 5 + [worker])
            command = _command(draw, history.state, worker)
        if draw(PURGE_CHANCE) == 0:  # an operator's erasure: any worker, any time, also after the end
            command = PurgeThread("erasure request", 1, "sha256:" + "0" * 64)
        with contextlib.suppress(errors.Rejection):
            history.record(command, worker=worker)
        history.advance(draw(CLOCK_STEPS))
    return history.log
