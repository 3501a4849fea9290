"""Hypothesis tries to break invariants 2-5 of the design's domain.md against the pure domain.

A state machine drives one run with several workers, random (often wrong) epochs, clock jumps and
random commands, many of them invalid. After every submission it checks what the pure domain must
guarantee on its own:

- (2) an accepted fenced command came from the lease holder, at the current epoch, before expiry;
  one that fails the fence is refused as stale_epoch (carrying the current epoch) or lease_expired;
- (3) every grant advances the epoch by one, grants strictly increase, the epoch never goes back;
- (4) idempotency belongs to the ledger; here: ``decide`` is deterministic and ``evolve``/``fold``
  never mutate their input (and folding from scratch equals the incremental state);
- (5) usage never decreases, never passes a ceiling after an accepted submission, and a rejected
  submission leaves the state exactly as it was;

and that the sealed log always verifies (checked once per example), while altering any single field
of any stored event breaks verification at exactly that event's position (a rule of its own).
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
)

from baton.domain import errors
from baton.domain.budgets import COUNTERS, MAX_COUNTER, Ceilings, Usage
from baton.domain.chain import seal, verify_chain
from baton.domain.commands import (
    AcquireLease,
    Command,
    CompleteRun,
    ExpireLease,
    FailRun,
    OpenRun,
    ReconcileIntent,
    RecordIntent,
    RecordObservation,
    RecordTransition,
    ReleaseLease,
    RenewLease,
    SealCheckpoint,
    Submission,
)
from baton.domain.decide import MAX_INLINE_BYTES, context_digest, decide, envelope_epoch
from baton.domain.events import BlobRef, FailureReason, IntentContext, LeaseGranted, RecordedEvent
from baton.domain.stages import Stage, is_legal
from baton.domain.state import RunState, evolve, fold, intended_ops

from .given import RUN, T0, TASK, W1, W2, W3, altered, placement

WORKERS = (W1, W2, W3)
OPS = ("op-0", "op-1", "op-2", "op-3")
# The first three are fine; a float has no canonical form (malformed); the last is too large inline.
ARGUMENTS: tuple[dict[str, Any], ...] = (
    {"k": "v"},
    {"n": 1, "s": "é"},
    {"pad": "x" * 300},
    {"f": 0.5},
    {"pad": "x" * MAX_INLINE_BYTES},
)
UNFENCED = (OpenRun, AcquireLease, ExpireLease)
KINDS: tuple[Literal["effect", "pure"], ...] = ("effect", "effect", "pure")
RESOLUTIONS: tuple[Literal["applied", "not_applied", "abandoned"], ...] = ("applied", "not_applied", "abandoned")
PLAUSIBLE_OUTCOMES: tuple[tuple[Literal["ok", "failed"], FailureReason | None], ...] = (
    ("ok", None),
    ("ok", None),
    ("failed", "timeout"),
)


def _context(op_id: str, arguments: dict[str, Any]) -> IntentContext:
    return IntentContext(1, op_id, effect="write", arguments=arguments)


# -- strategies -----------------------------------------------------------------------------------


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Pick a strategy with the given relative weights, then draw from it."""
    return st.sampled_from([strategy for weight, strategy in choices for _ in range(weight)]).flatmap(lambda s: s)


def _maybe(values: st.SearchStrategy[int]) -> st.SearchStrategy[int | None]:
    return weighted((2, st.none()), (1, values))


valid_ceilings = st.builds(
    Ceilings,
    calls=_maybe(st.integers(0, 12)),
    argument_bytes=_maybe(st.integers(0, 1500)),
    result_bytes=_maybe(st.integers(0, 6000)),
    fuel=_maybe(st.integers(0, 300)),
    cost_micros=_maybe(st.integers(0, 100)),
    iterations=_maybe(st.integers(0, 2)),
    stages=_maybe(st.integers(0, 12)),
)
ceilings = weighted((5, valid_ceilings), (1, st.builds(Ceilings, fuel=st.just(-1))))  # -1: malformed ceiling
usages = st.builds(
    Usage,
    calls=st.sampled_from([0] * 7 + [1]),  # an observation may not report calls: malformed
    result_bytes=st.sampled_from([0, 10, 1000]),
    fuel=st.sampled_from([0, 1, 50, MAX_COUNTER // 2, MAX_COUNTER]),  # big ones probe counter_overflow
    cost_micros=st.sampled_from([0, 0, 0, 10, -1]),
)
blob_refs = st.none() | st.builds(BlobRef, digest=st.just("sha256:" + "e" * 64), size=st.sampled_from([0, 100, 5000]))
RESULTS: tuple[Any, ...] = (None, None, "ok", {"rows": [1, 2, 3]}, {"pad": "y" * 2000}, {"score": 0.5})
# Strategies draw indices, not the values: Hypothesis puts strategy reprs into its events, and a
# repr holding a 64 KiB literal would dominate the run time.
results = st.integers(0, len(RESULTS) - 1).map(RESULTS.__getitem__)
ttls = st.sampled_from([0, 1, 1_000, 30_000, 30_000, 60_000])
ops = st.sampled_from(OPS)
argument_choices = st.sampled_from([0, 0, 0, 1, 2, 3, 4])  # index into ARGUMENTS
outcomes = st.sampled_from([("ok", None)] * 3 + [("failed", "timeout"), ("failed", None), ("ok", "timeout")])


def _quoted(op_id: str, choice: int) -> str:
    """The digest an observation quotes: right for ``intent(op_id, ARGUMENTS[choice])``, or garbage."""
    return context_digest(_context(op_id, ARGUMENTS[choice])) if choice < 3 else "sha256:bogus"


open_runs = st.builds(
    OpenRun,
    release_id=st.just("rel-1"),
    schema_name=st.just("agent-state"),
    schema_version=st.sampled_from([1, 1, -1]),
    task_ref=st.just(TASK),
    ceilings=ceilings,
)
intents = st.builds(
    lambda op, kind, choice: RecordIntent(op, kind, "shell@1", _context(op, ARGUMENTS[choice]), f"idem-{op}"),
    ops,
    st.sampled_from(KINDS),
    argument_choices,
)
observations = st.builds(
    lambda op, choice, outcome, result, ref, usage: RecordObservation(
        op, _quoted(op, choice), outcome[0], outcome[1], result, ref, usage
    ),
    ops,
    argument_choices,
    outcomes,
    results,
    blob_refs,
    usages,
)
reconciliations = st.builds(
    ReconcileIntent,
    op_id=ops,
    resolution=st.sampled_from(RESOLUTIONS),
    evidence=st.sampled_from(["host log", "host log", ""]),
    result=results,
    result_ref=blob_refs,
    usage=usages,
)
commands: st.SearchStrategy[Command] = weighted(
    (1, open_runs),
    (3, st.builds(lambda w, ttl: AcquireLease(placement(w), ttl), st.sampled_from(WORKERS), ttls)),
    (2, st.builds(RenewLease, ttl_ms=ttls)),
    (1, st.just(ReleaseLease())),
    (1, st.just(ExpireLease())),
    (6, intents),
    (6, observations),
    (3, reconciliations),
    (4, st.builds(RecordTransition, to_stage=st.sampled_from(list(Stage)), state_digest=st.just("sha256:s"))),
    (2, st.builds(SealCheckpoint, checkpoint_id=st.sampled_from(["c-1", "c-2"]), state_digest=st.just("sha256:s"))),
    (1, st.builds(CompleteRun)),
    (1, st.builds(FailRun, reason=st.just("gave_up"))),
)


# -- tampering ------------------------------------------------------------------------------------


def _leaf_paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths to every scalar and every empty container inside a decoded envelope."""
    if isinstance(value, dict) and value:
        return [p for key, item in value.items() for p in _leaf_paths(item, (*path, key))]
    if isinstance(value, list) and value:
        return [p for index, item in enumerate(value) for p in _leaf_paths(item, (*path, index))]
    return [path]


def _with_altered_leaf(envelope: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
    tampered = copy.deepcopy(envelope)
    parent: Any = tampered
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = altered(parent[path[-1]])
    return tampered


def _snapshot(state: RunState) -> bytes:
    """Every field of ``state`` as bytes: equal snapshots mean an untouched state (cheaper than deepcopy)."""
    return msgspec.json.encode(state)


# -- the machine ------------------------------------------------------------------------------------


class RunProtocol(RuleBasedStateMachine):
    """One run, three workers, the store's clock, and every rule of ``decide`` under attack."""

    def __init__(self) -> None:
        super().__init__()
        self.state = RunState(run_id=RUN)
        self.log: list[RecordedEvent] = []
        self.now = T0
        self.last_granted_epoch = 0
        self.submissions = 0

    @initialize(opened=st.sampled_from([True] * 15 + [False]), limits=valid_ceilings)
    def maybe_open(self, opened: bool, limits: Ceilings) -> None:
        """Most runs start opened (with random ceilings) so the interesting rules are reached."""
        if opened:
            self._submit(W1, 0, OpenRun("rel-1", "agent-state", 1, TASK, limits))

    @rule(micros=st.sampled_from([0, 1, 1_000, 1_000_000, 5_000_000, 29_999_999, 30_000_000, 61_000_000]))
    def advance_clock(self, micros: int) -> None:
        """The store's clock moves on (never the workers' own clocks)."""
        self.now += micros

    @rule(
        worker=st.sampled_from(WORKERS),
        epoch=st.sampled_from(["current", "current", "current", "previous", "next"]) | st.integers(-1, 4),
        command=commands,
    )
    def submit(self, worker: str, epoch: str | int, command: Command) -> None:
        """Any worker sends any command quoting any epoch: the attacker's rule."""
        offsets = {"current": 0, "previous": -1, "next": 1}
        quoted = self.state.epoch + offsets[epoch] if isinstance(epoch, str) else epoch
        self._submit(worker, max(quoted, -1), command)  # -1 probes the malformed-epoch rule

    @rule(command=commands)
    def holder_submits_anything(self, command: Command) -> None:
        """The rightful holder sends a random (often invalid) command at the right epoch."""
        self._submit(self.state.holder or W1, self.state.epoch, command)

    @rule(data=st.data())
    def holder_makes_progress(self, data: st.DataObject) -> None:
        """A well-behaved holder (taking over an absent or expired lease first) so accepted histories grow."""
        lease = self.state.lease
        if lease is None or self.now >= lease.expires_at:
            successor = data.draw(st.sampled_from(WORKERS), label="successor")
            self._submit(successor, self.state.epoch, AcquireLease(placement(successor)))
            return
        uncertain = sorted(self.state.operations)
        moves = ["intent", "intent", "transition", "transition", "seal", "renew"]
        moves += ["observe", "observe", "observe", "reconcile"] if uncertain else []
        moves += ["observe_any"] if intended_ops(self.state) else []  # settled or older ones must be refused
        move = data.draw(st.sampled_from(moves), label="move")
        command: Command
        if move == "intent":
            op_id = f"op-p{len(intended_ops(self.state))}"
            kind = data.draw(st.sampled_from(KINDS), label="kind")
            arguments = ARGUMENTS[data.draw(st.integers(0, 2), label="arguments")]
            command = RecordIntent(op_id, kind, "shell@1", _context(op_id, arguments), f"idem-{op_id}")
        elif move in {"observe", "observe_any"}:
            pool = uncertain if move == "observe" else sorted(intended_ops(self.state))
            op_id = data.draw(st.sampled_from(pool), label="op")
            outcome, reason = data.draw(st.sampled_from(PLAUSIBLE_OUTCOMES), label="outcome")
            fuel = weighted((9, st.integers(0, 30)), (1, st.just(MAX_COUNTER)))  # probes counter_overflow
            usage = data.draw(st.builds(Usage, fuel=fuel, cost_micros=st.integers(0, 10)))
            open_op = self.state.operations.get(op_id)
            right = open_op.context_digest if open_op is not None else "sha256:settled"
            quoted = data.draw(st.sampled_from([right] * 9 + ["sha256:wrong"]), label="quoted digest")
            command = RecordObservation(op_id, quoted, outcome, reason, data.draw(results), data.draw(blob_refs), usage)
        elif move == "reconcile":
            op_id = data.draw(st.sampled_from(uncertain), label="op")
            resolution = data.draw(st.sampled_from(RESOLUTIONS), label="resolution")
            command = ReconcileIntent(op_id, resolution, "host log", usage=Usage(fuel=data.draw(st.integers(0, 5))))
        elif move == "transition":
            legal = [stage for stage in Stage if is_legal(self.state.stage, stage)] or [Stage.GENERATING]
            command = RecordTransition(data.draw(st.sampled_from(legal), label="to_stage"), "sha256:s")
        elif move == "seal":
            command = SealCheckpoint(f"c-{self.state.version}", "sha256:s")
        else:
            command = RenewLease()
        self._submit(lease.worker, self.state.epoch, command)

    @precondition(lambda self: bool(self.log))
    @rule(data=st.data())
    def tampering_with_any_field_breaks_the_chain_there(self, data: st.DataObject) -> None:
        """Altering one leaf of one stored envelope makes verification fail at that very position."""
        stored = [msgspec.json.encode(envelope) for envelope in self.log]
        index = data.draw(st.integers(0, len(stored) - 1), label="event index")
        envelope = msgspec.json.decode(stored[index])
        path = data.draw(st.sampled_from(_leaf_paths(envelope)), label="field path")
        stored[index] = msgspec.json.encode(_with_altered_leaf(envelope, path))

        with pytest.raises(errors.ChainBroken) as caught:
            verify_chain(stored, run_id=RUN)

        assert caught.value.position == index + 1, (path, caught.value.message)

    # -- one submission, checked ------------------------------------------------------------------

    def _submit(self, worker: str, epoch: int, command: Command) -> None:
        self.submissions += 1
        submission = Submission(f"sub-{self.submissions}", RUN, worker, command, epoch)
        before = self.state
        snapshot = _snapshot(before)
        fence = self._fence_answer(worker, epoch, command)
        try:
            bodies = decide(before, submission, self.now)
        except errors.Rejection as rejection:
            event(f"rejected: {rejection.reason}")
            assert _snapshot(before) == snapshot, "(5) a rejected submission must leave the state unchanged"
            assert fence is None or rejection.reason == fence, f"(2) expected {fence}, got {rejection.reason}"
            if isinstance(rejection, errors.StaleEpoch):
                assert rejection.current_epoch == before.epoch, "(2) a stale append learns the current epoch"
            return
        assert fence is None, f"(2) accepted although the fence says {fence}"

        # (4) decide is a function of (state, submission, now) alone: no mutation, same answer on an equal copy.
        assert _snapshot(before) == snapshot, "decide must not mutate its state"
        assert decide(msgspec.json.decode(snapshot, type=RunState), submission, self.now) == bodies
        assert decide(before, submission, self.now) == bodies

        # (2) fenced events only from the holder of the current, unexpired epoch.
        if not isinstance(command, UNFENCED):
            lease = before.lease
            assert lease is not None, "(2) fenced command accepted without a lease"
            assert lease.worker == worker, "(2) fenced command accepted from a non-holder"
            assert submission.epoch == before.epoch == lease.epoch, "(2) fenced command at a stale epoch"
            assert self.now < lease.expires_at, "(2) fenced command accepted on an expired lease"

        epoch = envelope_epoch(before, submission, bodies)
        recorded = seal(RUN, before.version, before.head_digest, submission, epoch, bodies, self.now)

        # (4) evolve/fold never touch their input.
        after = before
        for envelope in recorded:
            step_snapshot = _snapshot(after)
            nxt = evolve(after, envelope)
            assert _snapshot(after) == step_snapshot, "evolve must not mutate its input state"
            after = nxt
        assert fold(recorded, before) == after
        assert _snapshot(before) == snapshot, "folding must not mutate the state it started from"
        if not isinstance(command, UNFENCED):
            assert {(r.worker, r.epoch) for r in recorded} == {(worker, before.epoch)}, "(2) envelope identity"

        # (3) a new lease always advances the epoch, by one; grants strictly increase.
        for body in bodies:
            if isinstance(body, LeaseGranted):
                assert body.epoch == before.epoch + 1, "(3) a grant must advance the epoch by one"
                assert body.epoch > self.last_granted_epoch, "(3) grant epochs must strictly increase"
                self.last_granted_epoch = body.epoch
        assert after.epoch >= before.epoch, "(3) the epoch never goes back"

        # (5) usage never decreases and never passes a ceiling.
        for name in COUNTERS:
            used, previously = getattr(after.usage, name), getattr(before.usage, name)
            assert used >= previously, f"(5) usage.{name} decreased"
            ceiling = getattr(after.ceilings, name)
            assert ceiling is None or used <= ceiling, f"(5) usage.{name}={used} passed its ceiling {ceiling}"
            assert 0 <= used <= MAX_COUNTER

        self.state = after
        self.log.extend(recorded)
        event(f"accepted: {type(command).__name__}")

    def _fence_answer(self, worker: str, epoch: int, command: Command) -> str | None:
        """The rejection fencing alone demands for this submission, or None when the fence lets it pass."""
        state = self.state
        if isinstance(command, UNFENCED) or epoch < 0 or not state.opened or state.closed:
            return None
        lease = state.lease
        if lease is None or lease.worker != worker or epoch != state.epoch:
            return "stale_epoch"
        return "lease_expired" if self.now >= lease.expires_at else None

    # -- checks over the whole log, once per example (per step they would make shrinking quadratic) --

    def teardown(self) -> None:
        report = verify_chain((msgspec.json.encode(e) for e in self.log), run_id=RUN)
        assert (report.events, report.head_digest) == (self.state.version, self.state.head_digest)
        assert fold(self.log, run_id=RUN) == self.state, "folding from scratch must equal the incremental state"


RunProtocol.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestRunProtocol = RunProtocol.TestCase
TestRunProtocol.__doc__ = "Random multi-worker histories never break invariants 2-5 or the hash chain."


# -- plain property tests ---------------------------------------------------------------------------


def _history(steps: list[tuple[str, Command]]) -> tuple[RunState, list[RecordedEvent]]:
    """Fold accepted steps through decide -> seal -> apply; rejected ones are skipped."""
    state, log, now = RunState(run_id=RUN), [], T0
    for n, (worker, command) in enumerate(steps):
        submission = Submission(f"s-{n}", RUN, worker, command, state.epoch)
        try:
            bodies = decide(state, submission, now)
        except errors.Rejection:
            continue
        epoch = envelope_epoch(state, submission, bodies)
        recorded = seal(RUN, state.version, state.head_digest, submission, epoch, bodies, now)
        state = fold(recorded, state)
        log.extend(recorded)
        now += 7_000_000
    return state, log


steps = st.lists(st.tuples(st.sampled_from(WORKERS), commands), max_size=30)


@settings(max_examples=60, deadline=None)
@given(history_steps=steps, cut=st.integers(1, 7))
def test_fold_is_independent_of_chunking(history_steps: list[tuple[str, Command]], cut: int) -> None:
    """Folding a log in chunks of any size gives the same state as folding it at once."""
    prefix: list[tuple[str, Command]] = [
        (W1, OpenRun("rel-1", "agent-state", 1, TASK)),
        (W1, AcquireLease(placement(W1))),
    ]
    state, log = _history(prefix + history_steps)
    chunked = RunState(run_id=RUN)
    for start in range(0, len(log), cut):
        chunked = fold(log[start : start + cut], chunked)
    assert chunked == fold(log, run_id=RUN) == state
