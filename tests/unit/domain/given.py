"""Given/when/then helpers: build a run's history through the real decide -> seal -> apply path.

A ``History`` starts from a fresh ``RunState`` and records each accepted submission exactly as the
ledger does (same envelope epoch rule), so tests state their preconditions as prior events rather
than as hand-built states that could drift from what ``decide`` actually allows.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

import msgspec
import pytest

from baton.domain import errors
from baton.domain.budgets import Ceilings
from baton.domain.chain import seal
from baton.domain.commands import (
    AcquireLease,
    Command,
    OpenRun,
    RecordIntent,
    RecordObservation,
    RecordTransition,
    ResumeFrom,
    Submission,
)
from baton.domain.decide import context_digest, decide, envelope_epoch
from baton.domain.events import BlobRef, Event, IntentContext, Placement, RecordedEvent
from baton.domain.stages import Stage
from baton.domain.state import RunState, apply

__all__ = [
    "RUN",
    "T0",
    "TASK",
    "W1",
    "W2",
    "W3",
    "History",
    "Kind",
    "context",
    "given",
    "intent",
    "observation",
    "open_run",
    "placement",
    "seconds",
    "single",
]

RUN = "run-1"
W1 = "worker-a"
W2 = "worker-b"
W3 = "worker-c"
T0 = 1_700_000_000_000_000  # microseconds since the epoch, like the store's injected clock
TASK = BlobRef("sha256:" + "a" * 64, 42, "blob://task")


def altered(value: Any) -> Any:
    """A different value of the same kind (so a tamper is never a mere re-spelling)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return str(int(value) + 1) if value.isdecimal() else value + "!"  # the stored form's integers are strings
    if isinstance(value, list):
        return [*value, "!"]
    if isinstance(value, dict):
        return {**value, "!": "!"}
    return "!"  # None


def seconds(n: int) -> int:
    """``n`` seconds in the clock's unit (microseconds)."""
    return n * 1_000_000


def placement(worker: str) -> Placement:
    return Placement(worker, model="m-1", provider="p-1", region="eu", tool_contracts=("shell@1",))


def open_run(ceilings: Ceilings | None = None) -> OpenRun:
    return OpenRun("rel-1", "agent-state", 1, TASK, ceilings or Ceilings())


def context(op_id: str, arguments: dict[str, Any] | None = None, turn: int = 1) -> IntentContext:
    return IntentContext(turn, op_id, effect="write", arguments=arguments if arguments is not None else {"k": "v"})


Kind = Literal["effect", "pure"]
E = TypeVar("E")


def intent(op_id: str, kind: Kind = "effect", arguments: dict[str, Any] | None = None) -> RecordIntent:
    return RecordIntent(op_id, kind, "shell@1", context(op_id, arguments), f"idem-{op_id}")


def single(events: Sequence[Event], kind: type[E]) -> E:
    """The one event in ``events``, checked to be a ``kind``."""
    assert len(events) == 1, events
    event = events[0]
    assert isinstance(event, kind), event
    return event


def observation(op_id: str, digest: str | None = None, **fields: Any) -> RecordObservation:
    """An ``ok`` observation quoting the digest of ``intent(op_id)`` unless told otherwise."""
    quoted = digest if digest is not None else context_digest(context(op_id))
    return RecordObservation(op_id, quoted, fields.pop("outcome", "ok"), **fields)


class History:
    """One run's recorded events and the state folded from them, plus the store's clock."""

    def __init__(self, run_id: str = RUN, now: int = T0) -> None:
        self._ids = itertools.count(1)
        self.state = RunState(run_id=run_id)
        self.log: list[RecordedEvent] = []
        self.now = now

    # -- building the history ------------------------------------------------------------------
    def submission(self, command: Command, *, worker: str = W1, epoch: int | None = None) -> Submission:
        """A submission from ``worker``; by default at the run's current epoch."""
        return Submission(
            f"sub-{next(self._ids)}", self.state.run_id, worker, command, self.state.epoch if epoch is None else epoch
        )

    def record(
        self, command: Command, *, worker: str = W1, epoch: int | None = None, alongside: bool = False
    ) -> list[RecordedEvent]:
        """Decide, seal and apply one submission, exactly as the ledger does; it must be accepted.

        ``alongside``: decided as releases before run discipline did, which let an intent start while
        others were open; their logs hold such runs, and the projections must still read them.
        """
        submission = self.submission(command, worker=worker, epoch=epoch)
        judged = msgspec.structs.replace(self.state, operations={}) if alongside else self.state
        bodies = decide(judged, submission, self.now)
        epoch = envelope_epoch(self.state, submission, bodies)
        recorded = seal(
            self.state.run_id, self.state.version, self.state.head_digest, submission, epoch, bodies, self.now
        )
        for event in recorded:
            apply(self.state, event)
        self.log.extend(recorded)
        return recorded

    def advance(self, micros: int) -> History:
        self.now += micros
        return self

    def opened(self, ceilings: Ceilings | None = None) -> History:
        self.record(open_run(ceilings))
        return self

    def leased(self, worker: str = W1, ttl_ms: int = 30_000, *, replayed: bool = True) -> History:
        """``worker`` takes the lease; taking it over, it has replayed the prefix unless told otherwise."""
        self.record(AcquireLease(placement(worker), ttl_ms), worker=worker)
        if replayed and self.state.replay_required and self.state.pending_handoff is None:
            self.resumed(worker)
        return self

    def resumed(self, worker: str = W1) -> History:
        """``worker`` says it replayed the prefix the ledger holds (``resume_from``)."""
        self.record(ResumeFrom(self.state.prefix_position, self.state.prefix_digest), worker=worker)
        return self

    def intended(self, op_id: str, kind: Kind = "effect", worker: str = W1, *, alongside: bool = False) -> History:
        """``worker`` records the intent of ``op_id``; ``alongside`` others still open (``record``)."""
        self.record(intent(op_id, kind), worker=worker, alongside=alongside)
        return self

    def observed(self, op_id: str, worker: str = W1) -> History:
        self.record(observation(op_id), worker=worker)
        return self

    def moved_to(self, target: Stage, worker: str = W1) -> History:
        """Walk the pipeline forward one legal step at a time until ``target``."""
        order = list(Stage)
        while self.state.stage is not target:
            step = order[order.index(self.state.stage) + 1]
            self.record(RecordTransition(step, f"sha256:{step.value.lower()}"), worker=worker)
        return self

    # -- when / then ----------------------------------------------------------------------------
    def when(
        self, command: Command, *, worker: str = W1, epoch: int | None = None, holder_gone: bool = False
    ) -> list[Event]:
        """The events ``command`` would produce now; checks that deciding left the state alone.

        ``holder_gone``: the store has seen the lease holder's liveness session end."""
        before = copy.deepcopy(self.state)
        submission = self.submission(command, worker=worker, epoch=epoch)
        events = decide(self.state, submission, self.now, holder_gone=holder_gone)
        assert self.state == before, "decide must not mutate the state it judges"
        return events

    def rejects(
        self, command: Command, *, worker: str = W1, epoch: int | None = None, holder_gone: bool = False
    ) -> errors.Rejection:
        """The rejection ``command`` gets now; checks that the state is exactly as before."""
        before = copy.deepcopy(self.state)
        submission = self.submission(command, worker=worker, epoch=epoch)
        with pytest.raises(errors.Rejection) as caught:
            decide(self.state, submission, self.now, holder_gone=holder_gone)
        assert self.state == before, "a rejected submission must leave the state unchanged"
        return caught.value


def given(run_id: str = RUN, now: int = T0) -> History:
    """A fresh, empty history: the run does not exist yet."""
    return History(run_id, now)
