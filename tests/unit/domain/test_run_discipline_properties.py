"""Hypothesis tries to break the run discipline (domain.md invariant 14) over random histories.

Three workers send random moves (intents with keys from a small shared pool, observations,
reconciliations, stage reservations, transitions, seals, completions, LangGraph checkpoints,
``resume_from`` with the right or a wrong prefix, takeovers, releases, expiries, in-store handoffs)
while the store's clock jumps past leases. Moves are built against the run as it stands (so that
many are accepted), and the rejected ones are simply not recorded. Then the **accepted log** is
checked, never the state's own flags:

- (a) while an intent has neither an observation nor a reconciliation in the log, no
  ``IntentRecorded``, ``TransitionRecorded``, ``StageReserved``, ``CheckpointSealed`` or
  ``RunCompleted`` (nor ``HandoffPrepared``, nor a LangGraph ``CheckpointRecorded``) follows it:
  only an observation or a reconciliation settles it;
- (b) after a ``LeaseGranted`` to another worker than the previous grant's, no ``IntentRecorded``,
  ``TransitionRecorded``, ``CheckpointSealed``, ``RunCompleted`` or ``HandoffPrepared`` of that
  worker precedes its ``ResumedFrom``, which names the position and chain digest of the last work
  event before that grant (a ``ResumedFrom`` nobody owed names the last work event before it);
- (c) no two intents that hold their key (open, observed, or reconciled ``applied``) share an
  idempotency key.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from baton.domain import errors
from baton.domain.budgets import Usage
from baton.domain.canonical import ZERO_DIGEST
from baton.domain.chain import seal
from baton.domain.commands import (
    AcceptHandoff,
    AcquireLease,
    Command,
    CompleteRun,
    ExpireLease,
    PrepareHandoff,
    PutCheckpoint,
    ReconcileIntent,
    RecordIntent,
    RecordObservation,
    RecordTransition,
    ReleaseLease,
    RenewLease,
    ReserveStage,
    ResumeFrom,
    SealCheckpoint,
    Submission,
)
from baton.domain.decide import context_digest
from baton.domain.events import (
    BlobRef,
    Event,
    HandoffPrepared,
    IntentReconciled,
    IntentRecorded,
    LeaseGranted,
    ObservationRecorded,
    RecordedEvent,
    ResumedFrom,
)
from baton.domain.handoff_document import state_digest_of
from baton.domain.stages import Stage, is_legal
from baton.domain.state import OpRecord

from ..projections.test_audit_handoff import STATE, document
from .given import W1, W2, W3, History, context, placement, seconds
from .given import given as history_of

WORKERS = (W1, W2, W3)
KEYS = ("k-0", "k-1", "k-2", "k-3")  # fewer keys than op ids: collisions are the point
WORK = ("IntentRecorded", "ObservationRecorded", "IntentReconciled", "TransitionRecorded", "StageReserved")
NOT_WHILE_OPEN = {
    "IntentRecorded",
    "TransitionRecorded",
    "StageReserved",
    "CheckpointSealed",
    "RunCompleted",
    "HandoffPrepared",
    "CheckpointRecorded",
}
NOT_BEFORE_RESUME = {"IntentRecorded", "TransitionRecorded", "CheckpointSealed", "RunCompleted", "HandoffPrepared"}
GIVES_THE_KEY_BACK = ("not_applied", "abandoned")
KINDS = ("effect", "pure")
RESOLUTIONS = ("applied", *GIVES_THE_KEY_BACK)

# -- moves ------------------------------------------------------------------------------------------


def weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Pick a strategy with the given relative weights, then draw from it."""
    return st.sampled_from([strategy for weight, strategy in choices for _ in range(weight)]).flatmap(lambda s: s)


senders = st.sampled_from(["holder"] * 9 + list(WORKERS))  # mostly the holder, sometimes anyone
moves = weighted(
    (3, st.tuples(st.just("advance"), st.sampled_from([0, seconds(1), seconds(10), seconds(31)]))),
    (2, st.tuples(st.just("acquire"), st.sampled_from(WORKERS))),
    (3, st.tuples(st.sampled_from(["renew", "release", "expire", "put_checkpoint"]), senders)),
    (2, st.tuples(st.just("seal"), senders)),
    (1, st.tuples(st.just("complete"), senders, st.integers(0, 3))),  # only one in four is sent: runs go on
    (2, st.tuples(st.just("accept"), senders)),
    (6, st.tuples(st.just("intent"), senders, st.integers(0, 9), st.sampled_from(KEYS), st.sampled_from(KINDS))),
    (6, st.tuples(st.just("observe"), senders, st.integers(0, 3), st.sampled_from(["ok", "ok", "failed"]))),
    (2, st.tuples(st.just("reconcile"), senders, st.integers(0, 3), st.sampled_from(RESOLUTIONS))),
    (2, st.tuples(st.just("reserve"), senders, st.integers(0, 20))),
    (3, st.tuples(st.just("transition"), senders, st.sampled_from(["forward"] * 4 + list(Stage)))),
    (3, st.tuples(st.just("resume"), senders, st.sampled_from(["right", "right", "wrong position", "wrong digest"]))),
    (2, st.tuples(st.just("prepare"), senders, st.sampled_from(WORKERS))),
)


class Run:
    """One run built by random moves against the run as it stands; what the ledger refuses is not recorded."""

    def __init__(self) -> None:
        self.history = history_of().opened()
        self.pending: tuple[str, str] | None = None  # the last prepared document and its digest

    def play(self, move: tuple[Any, ...]) -> None:
        kind, state = move[0], self.history.state
        if kind == "advance":
            self.history.advance(move[1])
            return
        lease = state.lease
        if kind == "acquire" or (move[1] == "holder" and (lease is None or self.history.now >= lease.expires_at)):
            # the lease is gone or lapsed: whoever moves next takes the run (often another worker)
            worker = move[1] if move[1] in WORKERS else WORKERS[len(self.history.log) % len(WORKERS)]
            self._submit(worker, AcquireLease(placement(worker)))
            return
        worker = (state.holder or W1) if move[1] == "holder" else move[1]
        command = getattr(self, f"_{kind}")(move, worker)
        if command is not None:
            self._submit(worker, command)

    def _submit(self, worker: str, command: Command) -> None:
        try:
            recorded = self.history.record(command, worker=worker)
        except errors.Rejection as rejection:
            event(f"rejected {type(command).__name__}: {rejection.reason}")
            return
        event(f"accepted {type(command).__name__}")
        if isinstance(command, PrepareHandoff):
            prepared = recorded[0].body
            assert isinstance(prepared, HandoffPrepared)
            self.pending = (command.document, prepared.document_digest)

    # -- one builder per move: the command it sends now, or None when there is nothing to send --

    def _renew(self, move: tuple[Any, ...], worker: str) -> Command:
        return RenewLease()

    def _release(self, move: tuple[Any, ...], worker: str) -> Command:
        return ReleaseLease()

    def _expire(self, move: tuple[Any, ...], worker: str) -> Command:
        return ExpireLease()

    def _put_checkpoint(self, move: tuple[Any, ...], worker: str) -> Command:
        return PutCheckpoint("", f"lg-{self.history.state.version}", BlobRef("sha256:" + "d" * 64, 1))

    def _seal(self, move: tuple[Any, ...], worker: str) -> Command:
        return SealCheckpoint(f"ckpt-{self.history.state.version}", state_digest_of(STATE))

    def _complete(self, move: tuple[Any, ...], worker: str) -> Command | None:
        return CompleteRun("done") if move[2] == 0 else None

    def _accept(self, move: tuple[Any, ...], worker: str) -> Command | None:
        return AcceptHandoff(*self.pending) if self.pending is not None else None

    def _intent(self, move: tuple[Any, ...], worker: str) -> Command:
        op_id = f"op-{move[2]}"
        return RecordIntent(op_id, move[4], "shell@1", context(op_id), move[3])

    def _observe(self, move: tuple[Any, ...], worker: str) -> Command | None:
        op = self._open_op(move[2])
        if op is None:
            return None
        failed = move[3] == "failed"
        return RecordObservation(op.op_id, op.context_digest, move[3], "tool_error" if failed else None)

    def _reconcile(self, move: tuple[Any, ...], worker: str) -> Command | None:
        op = self._open_op(move[2])
        return ReconcileIntent(op.op_id, move[3], "host log") if op is not None else None

    def _reserve(self, move: tuple[Any, ...], worker: str) -> Command:
        return ReserveStage(f"s-{move[2]}", move[2])

    def _transition(self, move: tuple[Any, ...], worker: str) -> Command:
        at = self.history.state.stage
        forward: list[Stage] = [stage for stage in Stage if is_legal(at, stage) and stage is not Stage.GENERATING]
        to_stage = move[2] if move[2] != "forward" else (forward or [Stage.GENERATING])[0]
        return RecordTransition(to_stage, "sha256:s")

    def _resume(self, move: tuple[Any, ...], worker: str) -> Command:
        """The prefix the sender owes (or the run's work so far), named right or wrong."""
        state = self.history.state
        owed = state.replay_required and state.last_holder == worker
        position, digest = (
            (state.prefix_position, state.prefix_digest) if owed else (state.work_position, state.work_digest)
        )
        if move[2] == "wrong position":
            position += 1
        elif move[2] == "wrong digest":
            digest = "sha256:" + "1" * 64
        return ResumeFrom(position, digest)

    def _prepare(self, move: tuple[Any, ...], worker: str) -> Command | None:
        state = self.history.state
        if state.lease is None or state.last_checkpoint_id is None or move[2] == state.holder:
            return None
        try:
            data, _ = document(self.history, move[2])
        except AssertionError:
            return None  # the log's portable state is not at the seal of STATE: no document describes it
        return PrepareHandoff(data)

    def _open_op(self, pick: int) -> OpRecord | None:
        open_ops = sorted(self.history.state.operations.values(), key=lambda op: op.intent_position)
        return open_ops[pick % len(open_ops)] if open_ops else None


# -- the properties, on the log -----------------------------------------------------------------------


def check_uncertainty_stops_the_run(log: list[RecordedEvent]) -> None:
    """(a) Nothing new while an intent of the log has no outcome in the log."""
    open_ops: set[str] = set()
    for e in log:
        assert not (open_ops and e.type in NOT_WHILE_OPEN), f"(a) {e.type} at {e.position} while {open_ops} open"
        if isinstance(e.body, IntentRecorded):
            open_ops.add(e.body.op_id)
        elif isinstance(e.body, ObservationRecorded | IntentReconciled):
            open_ops.discard(e.body.op_id)


def check_replay_before_new_work(log: list[RecordedEvent]) -> int:
    """(b) A worker the lease passed to says resume_from, with the right prefix, before new work;
    returns how many owed replays the log settles."""
    last_work = (0, ZERO_DIGEST)
    previous: str | None = None
    owed: dict[str, tuple[int, str]] = {}
    settled = 0
    for e in log:
        body = e.body
        if e.type in NOT_BEFORE_RESUME:
            assert e.worker not in owed, f"(b) {e.type} at {e.position} from {e.worker} before its ResumedFrom"
        if isinstance(body, ResumedFrom):
            settled += e.worker in owed
            expected = owed.pop(e.worker, last_work)
            assert (body.position, body.prefix_digest) == expected, f"(b) ResumedFrom at {e.position}"
        elif isinstance(body, LeaseGranted):
            if previous is not None and body.worker != previous:
                owed[body.worker] = last_work
            previous = body.worker
        if e.type in WORK:
            last_work = (e.position, e.digest)
    return settled


def check_keys_are_used_once(log: list[RecordedEvent]) -> None:
    """(c) A key is held by at most one intent that is open, observed or reconciled applied."""
    holding: dict[str, str] = {}  # key -> op id
    key_of: dict[str, str] = {}
    for e in log:
        body = e.body
        if isinstance(body, IntentRecorded):
            key = body.idempotency_key
            assert key not in holding, f"(c) {body.op_id} at {e.position} reuses {key} of {holding.get(key)}"
            holding[key], key_of[body.op_id] = body.op_id, key
        elif isinstance(body, IntentReconciled) and body.resolution in GIVES_THE_KEY_BACK:
            holding.pop(key_of[body.op_id], None)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(moves, min_size=30, max_size=90))
def test_random_histories_keep_the_run_discipline(steps: list[tuple[Any, ...]]) -> None:
    """Whatever three workers send, the accepted log keeps rules (a), (b) and (c)."""
    run = Run()
    run.play(("acquire", W1))
    for move in steps:
        run.play(move)
    log = run.history.log

    check_uncertainty_stops_the_run(log)
    if check_replay_before_new_work(log):
        event("an owed replay was settled")
    check_keys_are_used_once(log)


def forged(history: History, body: Event, worker: str) -> list[RecordedEvent]:
    """``history``'s log with ``body`` appended behind ``decide``'s back (a valid chain)."""
    last = history.log[-1]
    submission = Submission(f"forged-{last.position}", history.state.run_id, worker, ReleaseLease(), 0)
    return [*history.log, *seal(last.run_id, last.position, last.digest, submission, last.epoch, [body], history.now)]


def intent_body(op_id: str, key: str) -> IntentRecorded:
    recorded = context(op_id)
    return IntentRecorded(op_id, "pure", "shell@1", recorded, context_digest(recorded), key, Usage(calls=1))


def test_check_a_refuses_an_intent_while_another_is_open() -> None:
    """(a) is not vacuous: a log with a second intent while the first has no outcome fails it."""
    history = history_of().opened().leased(W1).intended("op-1")

    with pytest.raises(AssertionError, match=r"\(a\)"):
        check_uncertainty_stops_the_run(forged(history, intent_body("op-2", "k-2"), W1))


def test_check_b_refuses_new_work_before_resume_from_and_a_wrong_prefix() -> None:
    """(b) is not vacuous: an intent of the new holder before its ResumedFrom fails it, and so does a
    ResumedFrom naming another prefix."""
    history = history_of().opened().leased(W1).intended("op-1").observed("op-1")
    history.advance(seconds(31)).leased(W2, replayed=False)

    with pytest.raises(AssertionError, match=r"\(b\)"):
        check_replay_before_new_work(forged(history, intent_body("op-2", "k-2"), W2))
    with pytest.raises(AssertionError, match=r"\(b\)"):
        check_replay_before_new_work(forged(history, ResumedFrom(1, ZERO_DIGEST), W2))
    history.resumed(W2).intended("op-2", worker=W2)
    check_replay_before_new_work(history.log)


def test_check_c_refuses_a_key_held_twice() -> None:
    """(c) is not vacuous: a second intent naming an observed intent's key fails it."""
    history = history_of().opened().leased(W1)
    history.record(RecordIntent("op-1", "pure", "shell@1", context("op-1"), "k"))
    history.observed("op-1")

    with pytest.raises(AssertionError, match=r"\(c\)"):
        check_keys_are_used_once(forged(history, intent_body("op-2", "k"), W1))
