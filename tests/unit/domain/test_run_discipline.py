"""Run discipline (issue 29; domain.md invariant 14): each rule, and an attempt to break it.

Given a history built through ``decide -> seal -> apply`` (``given.py``), when a command breaks one
of the rules below, then it is refused with that rule's reason code and the state is exactly as
before (``History.rejects`` asserts both); when it keeps them, then it records what it should.

* uncertainty stops everything: while an intent has no outcome, only settling it, ``resume_from``
  and lease upkeep are accepted (``uncertain_intent``);
* an idempotency key is used once per run, unless its intent is reconciled not applied or abandoned
  (``idempotency_key_reused``);
* after the lease passes to another worker, that worker's first work is ``resume_from`` with the
  position and chain digest of the replay prefix (``replay_required``, ``prefix_mismatch``);
* a reconciliation names who reconciled (``IntentReconciled.reconciled_by``);
* stages are counted per reservation, replayed ones too, and transitions charge none.
"""

from __future__ import annotations

from typing import Literal

import msgspec
import pytest

from baton.domain.budgets import Ceilings, Usage
from baton.domain.canonical import ZERO_DIGEST
from baton.domain.commands import (
    AcquireLease,
    Command,
    CompleteRun,
    FailRun,
    PrepareHandoff,
    PutCheckpoint,
    ReconcileIntent,
    RecordIntent,
    RecordTransition,
    ReleaseLease,
    RenewLease,
    ReserveStage,
    ResumeFrom,
    SealCheckpoint,
)
from baton.domain.events import (
    BlobRef,
    CheckpointRecorded,
    IntentReconciled,
    IntentRecorded,
    LeaseReleased,
    LeaseRenewed,
    ObservationRecorded,
    RecordedEvent,
    ResumedFrom,
    RunCompleted,
    RunFailed,
    StageReserved,
    TransitionRecorded,
)
from baton.domain.handoff_document import state_digest_of
from baton.domain.stages import Stage

from ..projections.test_audit_handoff import STATE, document, handed_over, sealed
from .given import W1, W2, W3, History, Kind, context, given, intent, observation, placement, seconds, single

LAPSED = seconds(31)  # past the default 30 s ttl
WORK_TYPES = ("IntentRecorded", "ObservationRecorded", "IntentReconciled", "TransitionRecorded", "StageReserved")
THREAD_DOCUMENT = BlobRef("sha256:" + "d" * 64, 10)


def keyed(op_id: str, key: str, kind: Kind = "effect") -> RecordIntent:
    """An intent of ``op_id`` that gives the external system ``key``."""
    return RecordIntent(op_id, kind, "shell@1", context(op_id), key)


def last_work_before(log: list[RecordedEvent], position: int) -> tuple[int, str]:
    """Position and chain digest of the last work event (intent, outcome, transition, reservation)
    before ``position``, read off the log itself."""
    work = [e for e in log if e.position < position and e.type in WORK_TYPES]
    return (work[-1].position, work[-1].digest) if work else (0, ZERO_DIGEST)


def last_grant(log: list[RecordedEvent]) -> int:
    return next(e.position for e in reversed(log) if e.type == "LeaseGranted")


# -- uncertainty stops everything -----------------------------------------------------------------


def uncertain_same_epoch() -> tuple[History, str]:
    """W1 sealed, then intended ``op-open`` and has no outcome for it; a handoff document to W3 was
    built at the seal. Returns the history and that document."""
    history = sealed()
    data, _ = document(history, W3)
    history.intended("op-open")
    return history, data


def uncertain_after_takeover() -> tuple[History, str]:
    """As ``uncertain_same_epoch``, then W1's lease lapsed and W2 took over and said ``resume_from``:
    only the intent W1 left without an outcome stands in the way."""
    history, data = uncertain_same_epoch()
    history.advance(LAPSED).leased(W2)
    assert not history.state.replay_required
    return history, data


SITUATIONS = {"same epoch": (uncertain_same_epoch, W1), "after a takeover": (uncertain_after_takeover, W2)}
REFUSED_WHILE_UNCERTAIN = [
    "effect intent",
    "pure intent",
    "reserve_stage",
    "transition",
    "seal",
    "complete",
    "prepare_handoff",
    "put_checkpoint",
]


def refused_while_uncertain(name: str, handoff_document: str) -> Command:
    commands: dict[str, Command] = {
        "effect intent": intent("op-next", kind="effect"),
        "pure intent": intent("op-next", kind="pure"),
        "reserve_stage": ReserveStage("s-next", 0),
        "transition": RecordTransition(Stage.CANDIDATE_READY, "sha256:cand"),
        "seal": SealCheckpoint("ckpt-next", state_digest_of(STATE)),
        "complete": CompleteRun("done"),
        "prepare_handoff": PrepareHandoff(handoff_document),
        "put_checkpoint": PutCheckpoint("", "lg-1", THREAD_DOCUMENT),
    }
    return commands[name]


@pytest.mark.parametrize("situation", SITUATIONS)
@pytest.mark.parametrize("name", REFUSED_WHILE_UNCERTAIN)
def test_while_an_intent_has_no_outcome_every_new_step_is_uncertain_intent(situation: str, name: str) -> None:
    """Given an intent without outcome (at the holder's own epoch, or left by the previous holder),
    when the holder tries any new step (an intent of either kind, a stage, a transition, a seal,
    completing, a handoff, a LangGraph checkpoint), then uncertain_intent and nothing changes."""
    build, holder = SITUATIONS[situation]
    history, data = build()

    assert history.rejects(refused_while_uncertain(name, data), worker=holder).reason == "uncertain_intent"


def test_while_an_intent_has_no_outcome_its_observation_settles_it_and_unblocks_the_run() -> None:
    """Given an intent without outcome at the holder's epoch, when it is observed, then the next
    intent is accepted: an observation is one of the two ways to settle."""
    history, _ = uncertain_same_epoch()
    history.record(observation("op-open"))

    assert single(history.when(intent("op-next")), IntentRecorded).op_id == "op-next"


@pytest.mark.parametrize("situation", SITUATIONS)
@pytest.mark.parametrize(
    ("command", "recorded"),
    [
        (ReconcileIntent("op-open", "applied", "host log line 7"), IntentReconciled),
        (RenewLease(), LeaseRenewed),
        (ReleaseLease(), LeaseReleased),
        (FailRun("gave_up"), RunFailed),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else type(value).__name__,
)
def test_while_an_intent_has_no_outcome_reconciling_and_lease_upkeep_are_accepted(
    situation: str, command: Command, recorded: type
) -> None:
    """Given an intent without outcome, when the holder reconciles it, renews, releases or fails the
    run, then that is recorded. (Accepting or aborting a handoff never meets an uncertain intent: a
    handoff cannot be prepared while one is open, and nothing else is accepted while one is pending.)"""
    build, holder = SITUATIONS[situation]
    history, _ = build()

    assert isinstance(single(history.when(command, worker=holder), recorded), recorded)


def test_while_an_intent_has_no_outcome_resume_from_is_accepted() -> None:
    """Given W2 took over from W1, which left an intent without outcome, when W2 says resume_from
    before reconciling, then ResumedFrom is recorded: saying what was replayed changes nothing outside."""
    history = given().opened().leased(W1).intended("op-open").advance(LAPSED).leased(W2, replayed=False)
    position, digest = history.state.prefix_position, history.state.prefix_digest

    assert single(history.when(ResumeFrom(position, digest), worker=W2), ResumedFrom) == ResumedFrom(position, digest)


def test_after_a_takeover_the_old_epochs_intent_cannot_be_observed_only_reconciled() -> None:
    """Given W2 took over an intent W1 left open, when W2 sends an observation for it, then
    reconciliation_required: only the run's own epoch observes; a later one must look and reconcile."""
    history, _ = uncertain_after_takeover()

    assert history.rejects(observation("op-open"), worker=W2).reason == "reconciliation_required"


# -- idempotency keys: once per run -----------------------------------------------------------------


def test_a_key_used_by_an_observed_intent_is_idempotency_key_reused() -> None:
    """Given an intent with key K observed ok, when another operation's intent names K, then
    idempotency_key_reused: the external system would take it for the first one."""
    history = given().opened().leased(W1)
    history.record(keyed("op-1", "K"))
    history.observed("op-1")

    assert history.rejects(keyed("op-2", "K")).reason == "idempotency_key_reused"


def test_a_key_used_by_an_intent_observed_failed_is_still_reused() -> None:
    """Given an intent with key K whose observation says it failed (the host saw it), when another
    intent names K, then idempotency_key_reused."""
    history = given().opened().leased(W1)
    history.record(keyed("op-1", "K"))
    history.record(observation("op-1", outcome="failed", failure_reason="tool_error"))

    assert history.rejects(keyed("op-2", "K")).reason == "idempotency_key_reused"


def test_a_key_whose_intent_was_reconciled_applied_is_reused() -> None:
    """Given an intent with key K left open by W1 and reconciled applied by W2 after a takeover,
    when W2 names K in a new intent, then idempotency_key_reused: the effect happened under K."""
    history = given().opened().leased(W1)
    history.record(keyed("op-1", "K"))
    history.advance(LAPSED).leased(W2)
    history.record(ReconcileIntent("op-1", "applied", "host has K"), worker=W2)

    assert history.rejects(keyed("op-2", "K"), worker=W2).reason == "idempotency_key_reused"


@pytest.mark.parametrize("resolution", ["not_applied", "abandoned"])
def test_a_key_given_back_by_a_reconciliation_may_be_used_again_once(
    resolution: Literal["not_applied", "abandoned"],
) -> None:
    """Given an intent with key K reconciled not_applied or abandoned, when a new intent names K, then
    it is recorded; and once it is, K is held again (a third intent naming it is refused)."""
    history = given().opened().leased(W1)
    history.record(keyed("op-1", "K"))
    history.record(ReconcileIntent("op-1", resolution, "host has no K"))

    assert single(history.when(keyed("op-2", "K")), IntentRecorded).idempotency_key == "K"
    history.record(keyed("op-2", "K"))
    history.observed("op-2")
    assert history.rejects(keyed("op-3", "K")).reason == "idempotency_key_reused"


def test_an_empty_idempotency_key_is_malformed() -> None:
    """An intent must name the key the external system will see: an empty one is malformed."""
    history = given().opened().leased(W1)

    assert history.rejects(keyed("op-1", "")).reason == "malformed"


def test_keys_stay_remembered_past_the_merge_at_256_intents() -> None:
    """Given 300 intents (the state keeps recent keys apart and merges them into a shared frozen set at
    256), when a new intent reuses a key from either part, then idempotency_key_reused; and the key of
    the intent whose arrival merged the set, reconciled not_applied, is given back from the frozen part."""
    history = given().opened().leased(W1)
    for n in range(1, 256):
        history.record(keyed(f"op-{n}", f"K-{n}"))
        history.observed(f"op-{n}")
    history.record(keyed("op-256", "K-256"))  # the 256th key: the recent part merges into the frozen one
    assert not history.state.recent_keys
    assert history.state.used_keys is not None and "K-256" in history.state.used_keys
    history.record(ReconcileIntent("op-256", "not_applied", "host has no K-256"))
    for n in range(257, 301):
        history.record(keyed(f"op-{n}", f"K-{n}"))
        history.observed(f"op-{n}")
    assert "K-300" in history.state.recent_keys

    assert history.rejects(keyed("op-new", "K-1")).reason == "idempotency_key_reused"  # frozen part
    assert history.rejects(keyed("op-new", "K-300")).reason == "idempotency_key_reused"  # recent part
    assert single(history.when(keyed("op-new", "K-256")), IntentRecorded).idempotency_key == "K-256"


# -- replay before new effects --------------------------------------------------------------------


def taken_over(*, open_intent: bool = False) -> History:
    """W1 reserved a stage, intended and observed ``op-1`` (and intended ``op-2`` without outcome when
    ``open_intent``); its lease lapsed and W2 took the run over, not yet having said resume_from."""
    history = given().opened().leased(W1)
    history.record(ReserveStage("s-1", 10))
    history.intended("op-1").observed("op-1")
    if open_intent:
        history.intended("op-2")
    history.advance(LAPSED).leased(W2, replayed=False)
    return history


def handed_over_in_store() -> History:
    """W1 sealed and handed the run to W2 in this store (prepare, then W2's acceptance); W2 has not
    said resume_from."""
    history = handed_over()
    assert history.log[-1].type == "HandoffAccepted"
    return history


MOVES = {"takeover": (taken_over, W2), "in-store handoff": (handed_over_in_store, W2)}
NEW_WORK: list[Command] = [
    intent("op-new"),
    intent("op-new", kind="pure"),
    RecordTransition(Stage.CANDIDATE_READY, "sha256:cand"),
    SealCheckpoint("ckpt-new", "sha256:state"),
    CompleteRun("done"),
]


@pytest.mark.parametrize("move", MOVES)
@pytest.mark.parametrize("command", NEW_WORK, ids=lambda c: f"{type(c).__name__}-{getattr(c, 'kind', '')}")
def test_new_work_before_resume_from_is_replay_required(move: str, command: Command) -> None:
    """Given the lease passed to W2 (by a takeover after W1's lease lapsed, or by a handoff W2 accepted
    in this store), when W2 records an intent, a transition, a seal or completes before resume_from,
    then replay_required and nothing changes."""
    build, holder = MOVES[move]
    history = build()

    assert history.state.replay_required
    assert history.rejects(command, worker=holder).reason == "replay_required"


def test_handing_the_run_on_before_resume_from_is_replay_required() -> None:
    """Given W2 took over, when it prepares a handoff before resume_from, then replay_required (the
    document is not even read)."""
    history = sealed()
    data, _ = document(history, W3)
    history.advance(LAPSED).leased(W2, replayed=False)

    assert history.rejects(PrepareHandoff(data), worker=W2).reason == "replay_required"


@pytest.mark.parametrize(
    ("command", "recorded"),
    [
        (ReserveStage("s-1", 10), StageReserved),
        (RenewLease(), LeaseRenewed),
        (PutCheckpoint("", "lg-1", THREAD_DOCUMENT), CheckpointRecorded),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else type(value).__name__,
)
def test_replaying_reserves_stages_and_keeps_the_lease_before_resume_from(command: Command, recorded: type) -> None:
    """Given W2 took over, when W2 reserves a stage again (a replay re-reserves what it replays),
    renews, or writes a LangGraph checkpoint (a thread's saver resumes from the checkpoint it reads:
    docs/langgraph.md) before resume_from, then it is recorded."""
    history = taken_over()

    assert isinstance(single(history.when(command, worker=W2), recorded), recorded)


def test_reconciling_before_resume_from_is_accepted_and_new_work_still_waits() -> None:
    """Given W2 took over an intent W1 left without outcome, when W2 reconciles it before resume_from,
    then IntentReconciled is recorded, and a new intent is then replay_required (not uncertain_intent)."""
    history = taken_over(open_intent=True)
    history.record(ReconcileIntent("op-2", "applied", "host log line 9"), worker=W2)

    assert isinstance(history.log[-1].body, IntentReconciled)
    assert history.rejects(intent("op-new"), worker=W2).reason == "replay_required"


@pytest.mark.parametrize("move", MOVES)
def test_resume_from_names_the_last_work_event_before_the_lease_changed_hands(move: str) -> None:
    """Given the lease passed to W2, when W2 says resume_from with the position and chain digest of the
    last work event before the LeaseGranted (read off the log, not the state), then ResumedFrom with
    exactly those, and W2's new intent is accepted afterwards."""
    build, holder = MOVES[move]
    history = build()
    position, digest = last_work_before(history.log, last_grant(history.log))
    assert (history.state.prefix_position, history.state.prefix_digest) == (position, digest)

    history.record(ResumeFrom(position, digest), worker=holder)

    assert history.log[-1].body == ResumedFrom(position, digest)
    assert not history.state.replay_required
    assert single(history.when(intent("op-new"), worker=holder), IntentRecorded).op_id == "op-new"


@pytest.mark.parametrize("wrong", ["position", "digest", "both"])
def test_resume_from_naming_another_prefix_is_prefix_mismatch(wrong: str) -> None:
    """Given W2 took over, when it says resume_from with another position, another digest (that of an
    earlier event of the same run), or both, then prefix_mismatch and the replay is still owed."""
    history = taken_over()
    position, digest = history.state.prefix_position, history.state.prefix_digest
    earlier = history.log[position - 2]
    named = {
        "position": (position - 1, digest),
        "digest": (position, earlier.digest),
        "both": (earlier.position, earlier.digest),
    }[wrong]

    assert history.rejects(ResumeFrom(*named), worker=W2).reason == "prefix_mismatch"
    assert history.rejects(intent("op-new"), worker=W2).reason == "replay_required"


def test_the_prefix_is_frozen_when_the_lease_changes_hands() -> None:
    """Given W2 took over and reserved a stage again (moving the run's last work event), when it names
    the run's work position in resume_from, then prefix_mismatch: it owes the prefix as it was when the
    lease passed, and naming that one is accepted."""
    history = taken_over()
    owed = (history.state.prefix_position, history.state.prefix_digest)
    history.record(ReserveStage("s-1", 10), worker=W2)
    now = (history.log[-1].position, history.log[-1].digest)

    assert history.rejects(ResumeFrom(*now), worker=W2).reason == "prefix_mismatch"
    assert single(history.when(ResumeFrom(*owed), worker=W2), ResumedFrom) == ResumedFrom(*owed)


def test_an_owed_replay_is_not_forgiven_by_letting_the_lease_lapse_and_taking_it_again() -> None:
    """Given W2 took over and never said resume_from, when its own lease lapses and it takes the run
    again, then its new work is still replay_required, and the prefix is still the one it owed."""
    history = taken_over()
    owed = (history.state.prefix_position, history.state.prefix_digest)
    history.advance(LAPSED).leased(W2, replayed=False)

    assert history.rejects(intent("op-new"), worker=W2).reason == "replay_required"
    assert (history.state.prefix_position, history.state.prefix_digest) == owed


def test_the_same_worker_retaking_its_own_lapsed_lease_owes_nothing() -> None:
    """Given W1 worked and its lease lapsed, when W1 takes the run again (a new epoch), then its next
    intent is accepted without resume_from: it replays nothing it did not write."""
    history = given().opened().leased(W1).intended("op-1").observed("op-1")
    history.advance(LAPSED).leased(W1, replayed=False)

    assert history.state.epoch == 2
    assert single(history.when(intent("op-2")), IntentRecorded).op_id == "op-2"


def test_a_former_holder_coming_back_owes_the_replay_of_what_came_after_it() -> None:
    """Given W1 -> W2 (which worked) -> W1 again, when W1 records an intent before resume_from, then
    replay_required, and the prefix ends at W2's last work event."""
    history = taken_over()
    history.resumed(W2).intended("op-w2", worker=W2).observed("op-w2", worker=W2)
    w2_last = (history.log[-1].position, history.log[-1].digest)
    history.advance(LAPSED).leased(W1, replayed=False)

    assert history.rejects(intent("op-back")).reason == "replay_required"
    assert (history.state.prefix_position, history.state.prefix_digest) == w2_last


def test_a_runs_first_holder_owes_nothing() -> None:
    """Given a run just opened and leased by W1, when W1 records an intent, then it is accepted; and if
    it says resume_from anyway, it must name the run's work so far (nothing yet: position 0)."""
    history = given().opened().leased(W1, replayed=False)

    assert single(history.when(intent("op-1")), IntentRecorded).op_id == "op-1"
    assert single(history.when(ResumeFrom(0, ZERO_DIGEST)), ResumedFrom).position == 0
    assert history.rejects(ResumeFrom(1, history.log[0].digest)).reason == "prefix_mismatch"


# -- reconciliation names its author --------------------------------------------------------------


def test_a_reconciliation_names_the_worker_that_submitted_it() -> None:
    """Given intents left open, when the holder that took over reconciles one and the holder at its own
    epoch reconciles another, then each IntentReconciled names its submitter."""
    history = given().opened().leased(W1).intended("op-1")
    history.record(ReconcileIntent("op-1", "abandoned", "the host is gone"))
    history.intended("op-2").advance(LAPSED).leased(W2)
    history.record(ReconcileIntent("op-2", "applied", "host log line 3"), worker=W2)

    reconciled = [e.body for e in history.log if isinstance(e.body, IntentReconciled)]
    assert [(r.op_id, r.reconciled_by) for r in reconciled] == [("op-1", W1), ("op-2", W2)]


def test_a_reconcile_command_cannot_name_someone_else_as_its_author() -> None:
    """The wire command has no author field: a reconcile_intent naming ``reconciled_by`` is undecodable
    (unknown field), so the author is always the submitter."""
    wire = b'{"type":"reconcile_intent","op_id":"op-1","resolution":"applied","evidence":"e","reconciled_by":"mallory"}'

    with pytest.raises(msgspec.ValidationError, match="reconciled_by"):
        msgspec.json.decode(wire, type=Command)


# -- stages are counted per reservation: the semaprax shape ----------------------------------------


def test_a_run_passing_a_b_c_with_b_suspending_fresh_and_after_replay_counts_exactly() -> None:
    """Given a run that moves A -> B -> C by takeovers (each after the previous holder released), where
    B suspends once fresh and once after replaying its stage, then usage is exactly as computed here.

    Every intent's arguments are ``{"k":"v"}``: 9 canonical bytes; no observation carries a result.

    A (W1, epoch 1), the run's first holder, owes no replay:
      reserve "plan" fuel 10      stages 1, reserved_fuel 10
      intent a-1 (pure)           calls 1, argument_bytes 9
      observe a-1, fuel 4         fuel 4
      GENERATING -> CANDIDATE_READY, seal, release    (a transition charges no stage)
    B (W2, epoch 2), fresh: the lease changed hands, so it says resume_from (A's prefix, which ends at
    A's transition) before new work:
      reserve "edit" fuel 20      stages 2, reserved_fuel 30
      intent b-1, observe fuel 7  calls 2, argument_bytes 18, fuel 11
      intent b-2, observe fuel 5  calls 3, argument_bytes 27, fuel 16
      release: B suspends without sealing
    B (W2, epoch 3), after replaying: it takes the run again; the ledger owes it nothing (same worker),
    but its process restarted, so it replays "edit" from the log: the stage is reserved again and
    charged again (nothing is refunded), b-1 and b-2 come from the log without new submissions; it
    says resume_from naming the run's work so far (the re-reservation), then goes on:
      reserve "edit" fuel 20      stages 3, reserved_fuel 50
      intent b-3, observe fuel 6  calls 4, argument_bytes 36, fuel 22
      CANDIDATE_READY -> GENERATING (rework)          iterations 1
      GENERATING -> CANDIDATE_READY, seal, release
    C (W3, epoch 4) says resume_from (B's prefix, ending at B's last transition); B sealed after it, so
    it has no stage to reserve again:
      reserve "verify" fuel 5     stages 4, reserved_fuel 55
      intent c-1 (pure), observe fuel 2               calls 5, argument_bytes 45, fuel 24
      CANDIDATE_READY -> VERIFYING, complete

    Totals: calls 5, argument_bytes 45, fuel 24, iterations 1, stages 4, reserved_fuel 55. The ceilings
    are exactly these, so one more stage (even with no fuel) is refused before C completes.
    """
    totals = Usage(calls=5, argument_bytes=45, fuel=24, iterations=1, stages=4, reserved_fuel=55)
    ceilings = Ceilings(**msgspec.structs.asdict(totals))
    history = given().opened(ceilings)

    def work(worker: str, op_id: str, fuel: int, kind: Kind = "effect") -> None:
        history.record(keyed(op_id, f"idem-{op_id}", kind), worker=worker)
        history.record(observation(op_id, usage=Usage(fuel=fuel)), worker=worker)

    # A
    history.leased(W1, replayed=False)
    history.record(ReserveStage("plan", 10))
    work(W1, "a-1", 4, kind="pure")
    history.record(RecordTransition(Stage.CANDIDATE_READY, "sha256:a"))
    history.record(SealCheckpoint("ckpt-a", "sha256:a"))
    history.record(ReleaseLease())
    assert history.state.usage == Usage(calls=1, argument_bytes=9, fuel=4, stages=1, reserved_fuel=10)
    # B, fresh
    history.record(AcquireLease(placement(W2)), worker=W2)
    history.resumed(W2)
    history.record(ReserveStage("edit", 20), worker=W2)
    work(W2, "b-1", 7)
    work(W2, "b-2", 5)
    history.record(ReleaseLease(), worker=W2)
    assert history.state.usage == Usage(calls=3, argument_bytes=27, fuel=16, stages=2, reserved_fuel=30)
    # B, after replaying
    history.record(AcquireLease(placement(W2)), worker=W2)
    assert not history.state.replay_required
    history.record(ReserveStage("edit", 20), worker=W2)
    history.record(ResumeFrom(history.state.work_position, history.state.work_digest), worker=W2)
    work(W2, "b-3", 6)
    history.record(RecordTransition(Stage.GENERATING, "sha256:b-rework"), worker=W2)
    history.record(RecordTransition(Stage.CANDIDATE_READY, "sha256:b"), worker=W2)
    history.record(SealCheckpoint("ckpt-b", "sha256:b"), worker=W2)
    history.record(ReleaseLease(), worker=W2)
    assert history.state.usage == Usage(calls=4, argument_bytes=36, fuel=22, iterations=1, stages=3, reserved_fuel=50)
    # C
    history.record(AcquireLease(placement(W3)), worker=W3)
    assert history.state.prefix_position == last_work_before(history.log, last_grant(history.log))[0]
    history.resumed(W3)
    history.record(ReserveStage("verify", 5), worker=W3)
    work(W3, "c-1", 2, kind="pure")
    history.record(RecordTransition(Stage.VERIFYING, "sha256:c"), worker=W3)
    assert history.rejects(ReserveStage("one-more", 0), worker=W3).reason == "budget_exceeded"
    history.record(CompleteRun("verified"), worker=W3)

    assert history.state.usage == totals
    assert [e.epoch for e in history.log if e.type == "ResumedFrom"] == [2, 3, 4]
    stages = [e.body.stage_id for e in history.log if isinstance(e.body, StageReserved)]
    assert stages == ["plan", "edit", "edit", "verify"]
    charged = [e.body.charge for e in history.log if isinstance(e.body, TransitionRecorded)]
    assert [c.stages for c in charged] == [0, 0, 0, 0] and [c.iterations for c in charged] == [0, 1, 0, 0]
    assert isinstance(history.log[-1].body, RunCompleted)
    assert all(not isinstance(e.body, ObservationRecorded) or e.body.charge.calls == 0 for e in history.log)
