"""Given these prior recorded events, when this submission, then these events or this rejection.

Every history is built through the real ``decide -> seal -> apply`` path (see ``given.py``); every
rejection is asserted by its stable ``reason`` code, never by its message, and ``History.rejects``
also checks that a rejected submission left the state exactly as it was.
"""

from __future__ import annotations

import msgspec
import pytest

from baton.domain import errors
from baton.domain.budgets import MAX_COUNTER, Ceilings, Usage
from baton.domain.canonical import canonical_bytes
from baton.domain.commands import (
    AcquireLease,
    Command,
    CompleteRun,
    ExpireLease,
    FailRun,
    OpenRun,
    ReconcileIntent,
    RecordTransition,
    ReleaseLease,
    RenewLease,
    ReserveStage,
    SealCheckpoint,
    Submission,
)
from baton.domain.decide import (
    MAX_ID_LENGTH,
    MAX_INLINE_BYTES,
    MAX_LIST_ITEMS,
    MAX_TEXT_LENGTH,
    MAX_TTL_MS,
    context_digest,
    decide,
)
from baton.domain.events import (
    BlobRef,
    CheckpointSealed,
    IntentReconciled,
    IntentRecorded,
    LeaseExpired,
    LeaseGranted,
    LeaseReleased,
    LeaseRenewed,
    ObservationRecorded,
    RunCompleted,
    RunFailed,
    RunOpened,
    StageReserved,
    TransitionRecorded,
)
from baton.domain.stages import Stage
from baton.domain.state import RunState, intended_ops

from .given import (
    RUN,
    T0,
    TASK,
    W1,
    W2,
    W3,
    History,
    Kind,
    context,
    given,
    intent,
    observation,
    open_run,
    placement,
    seconds,
    single,
)

TTL_US = 30_000 * 1000  # the default ttl_ms, in the clock's microseconds

# One instance of every fenced command: each needs the current lease, held and unexpired.
FENCED: list[Command] = [
    RenewLease(),
    ReleaseLease(),
    intent("op-new"),
    observation("op-1"),
    ReconcileIntent("op-1", "applied", "host log line 7"),
    RecordTransition(Stage.CANDIDATE_READY, "sha256:cand"),
    SealCheckpoint("ckpt-1", "sha256:state"),
    CompleteRun("done"),
    FailRun("gave_up"),
]


def _fenced_id(command: Command) -> str:
    return type(command).__name__


def stored_size(payload: object) -> int:
    """The bytes a payload occupies inside a stored event: canonical, ints as numbers, no newline."""
    return len(canonical_bytes(payload, opaque=True)) - 1


# --------------------------------------------------------------------------------------------------
# The stable reason codes
# --------------------------------------------------------------------------------------------------


def test_rejection_reason_codes_are_a_stable_wire_contract() -> None:
    """Each rejection class keeps the exact reason code that the bus, the CLI and verdicts map on."""
    assert {cls.__name__: cls.reason for cls in errors.Rejection.__subclasses__()} == {
        "Malformed": "malformed",
        "RunNotFound": "run_not_found",
        "RunAlreadyExists": "run_exists",
        "RunClosed": "run_closed",
        "StaleEpoch": "stale_epoch",
        "LeaseHeld": "lease_held",
        "NoLease": "no_lease",
        "LeaseExpired": "lease_expired",
        "IllegalTransition": "illegal_transition",
        "BudgetExceeded": "budget_exceeded",
        "CounterOverflow": "counter_overflow",
        "DuplicateOperation": "duplicate_operation",
        "UnknownOperation": "unknown_operation",
        "AlreadyObserved": "already_observed",
        "ContextMismatch": "context_mismatch",
        "UncertainIntent": "uncertain_intent",
        "ReconciliationRequired": "reconciliation_required",
        "ReplayDivergence": "replay_divergence",
        "ReplayIncomplete": "replay_incomplete",
        "MigrationUnsafe": "migration_unsafe",
        "PayloadTooLarge": "payload_too_large",
        "SubmissionConflict": "submission_conflict",
        "IdempotencyKeyReused": "idempotency_key_reused",
        "ReplayRequired": "replay_required",
        "PrefixMismatch": "prefix_mismatch",
        "AlreadyClaimed": "already_claimed",
        "ClaimRequired": "claim_required",
        "ClaimNotForThisStore": "claim_not_for_this_store",
        "NoncanonicalDocument": "noncanonical_document",
        "DocumentTooLarge": "document_too_large",
        "HandoffDigestMismatch": "digest_mismatch",
        "InconsistentDocument": "inconsistent_document",
        "CredentialInPayload": "credential_in_payload",
        "PriorUsageExhaustsDestination": "prior_usage_exhausts_destination",
        "MigrationMissing": "migration_missing",
        "HandoffUnsafe": "handoff_unsafe",
        "HandoffPending": "handoff_pending",
        "NoHandoff": "no_handoff",
        "SuccessorExists": "successor_exists",
        "AuthorityMissing": "authority_missing",
        "SelfAuthorization": "self_authorization",
        "ApprovalMismatch": "approval_mismatch",
        "ReverificationRequired": "reverification_required",
        "SignatureRequired": "signature_required",
        "BadSignature": "bad_signature",
        "UnknownPrincipal": "unknown_principal",
        "PrincipalRevoked": "principal_revoked",
        "PrincipalMismatch": "principal_mismatch",
        "RoleNotAllowed": "role_not_allowed",
        "SelfApproval": "self_approval",
        "ApprovalMissing": "approval_missing",
        "EvidenceMissing": "evidence_missing",
    }


# --------------------------------------------------------------------------------------------------
# Envelope checks that come before any command
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("submission_id", ""),
        ("submission_id", "s" * (MAX_ID_LENGTH + 1)),
        ("run_id", ""),
        ("run_id", "r" * (MAX_ID_LENGTH + 1)),
        ("worker", ""),
        ("worker", "w" * (MAX_ID_LENGTH + 1)),
        ("submission_id", "s-\x00"),
        ("run_id", "\x00"),
        ("worker", "w\x00-1"),
        ("epoch", -1),
    ],
)
def test_submission_with_empty_oversized_or_nul_id_or_negative_epoch_is_malformed(field: str, value: object) -> None:
    """An empty id, an id over MAX_ID_LENGTH or with a NUL character (which no SQL text column
    holds), or a negative epoch, is malformed, whatever the command."""
    submission = msgspec.structs.replace(Submission("s-1", RUN, W1, open_run()), **{field: value})

    with pytest.raises(errors.Rejection) as caught:
        decide(RunState(RUN), submission, T0)

    assert caught.value.reason == "malformed"


def test_ids_of_exactly_max_length_are_accepted() -> None:
    """Ids of exactly MAX_ID_LENGTH characters are within bounds."""
    long = "x" * MAX_ID_LENGTH
    submission = Submission(long, long, long, open_run())

    assert decide(RunState(long), submission, T0) == [RunOpened("rel-1", "agent-state", 1, TASK, Ceilings())]


# --------------------------------------------------------------------------------------------------
# open_run
# --------------------------------------------------------------------------------------------------


def test_open_run_on_a_fresh_run_records_run_opened_with_its_ceilings() -> None:
    """Opening a run that does not exist yet records RunOpened carrying release, schema, task and ceilings."""
    ceilings = Ceilings(calls=10, fuel=1000)

    events = given().when(open_run(ceilings))

    assert events == [RunOpened("rel-1", "agent-state", 1, TASK, ceilings)]


def test_open_run_needs_no_lease_and_any_epoch() -> None:
    """Opening is not fenced: any worker may open, even quoting a nonzero epoch."""
    assert given().when(open_run(), worker=W3, epoch=7) == [RunOpened("rel-1", "agent-state", 1, TASK, Ceilings())]


def test_open_run_twice_is_rejected_as_run_exists() -> None:
    """A run that was already opened cannot be opened again."""
    err = given().opened().rejects(open_run())

    assert err.reason == "run_exists"


def test_open_run_of_a_closed_run_is_still_run_exists() -> None:
    """A completed run is not reopened: opening it again is run_exists, not a fresh start."""
    history = given().opened().leased(W1)
    history.record(CompleteRun())

    assert history.rejects(open_run()).reason == "run_exists"


@pytest.mark.parametrize(
    "command",
    [
        OpenRun("rel-1", "agent-state", -1, TASK),
        OpenRun("rel-1", "agent-state", 1, BlobRef(TASK.digest, -1)),
        OpenRun("rel-1", "agent-state", 1, TASK, Ceilings(calls=-1)),
        OpenRun("rel-1", "agent-state", 1, TASK, Ceilings(fuel=MAX_COUNTER + 1)),
    ],
    ids=["negative_schema_version", "negative_task_size", "negative_ceiling", "ceiling_past_bigint"],
)
def test_open_run_with_negative_or_out_of_range_numbers_is_malformed(command: OpenRun) -> None:
    """Negative schema versions, task sizes or ceilings, and ceilings past bigint, are malformed."""
    assert given().rejects(command).reason == "malformed"


# --------------------------------------------------------------------------------------------------
# Run existence and closure
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [AcquireLease(placement(W1)), ExpireLease(), *FENCED], ids=_fenced_id)
def test_any_command_but_open_on_a_run_that_does_not_exist_is_run_not_found(command: Command) -> None:
    """Before RunOpened there is no run: every other command is run_not_found."""
    assert given().rejects(command).reason == "run_not_found"


@pytest.mark.parametrize("closing", [CompleteRun("done"), FailRun("gave_up")], ids=["completed", "failed"])
@pytest.mark.parametrize("command", [AcquireLease(placement(W1)), ExpireLease(), *FENCED], ids=_fenced_id)
def test_any_command_on_a_closed_run_is_run_closed(closing: Command, command: Command) -> None:
    """After RunCompleted or RunFailed nothing more is accepted, whoever asks and at whatever epoch."""
    history = given().opened().leased(W1)
    history.record(closing)

    err = history.rejects(command, worker=W1, epoch=1)

    assert err.reason == "run_closed"
    assert history.state.lease is None


# --------------------------------------------------------------------------------------------------
# acquire_lease
# --------------------------------------------------------------------------------------------------


def test_first_acquire_grants_epoch_one_expiring_after_the_ttl() -> None:
    """The first lease of a run is epoch 1, expiring ttl_ms after the store's clock reading."""
    events = given().opened().when(AcquireLease(placement(W1), ttl_ms=5_000), worker=W1)

    assert events == [LeaseGranted(W1, 1, placement(W1), T0 + 5_000 * 1000)]


def test_acquire_while_another_worker_holds_an_unexpired_lease_is_lease_held() -> None:
    """A live lease cannot be taken over, not even one microsecond before it expires."""
    history = given().opened().leased(W1).advance(TTL_US - 1)

    assert history.rejects(AcquireLease(placement(W2)), worker=W2).reason == "lease_held"


def test_acquire_by_the_holder_itself_while_unexpired_is_lease_held() -> None:
    """The holder renews rather than re-acquires; re-acquiring would advance the epoch under itself."""
    history = given().opened().leased(W1)

    assert history.rejects(AcquireLease(placement(W1)), worker=W1, epoch=1).reason == "lease_held"


def test_acquire_after_expiry_records_lease_expired_then_a_grant_at_the_next_epoch() -> None:
    """Once the clock reaches the expiry, a new worker's acquire expires the old lease and takes epoch+1."""
    history = given().opened().leased(W1).advance(TTL_US)

    events = history.when(AcquireLease(placement(W2)), worker=W2)

    assert events == [LeaseExpired(W1, 1, T0 + TTL_US), LeaseGranted(W2, 2, placement(W2), T0 + 2 * TTL_US)]


def test_acquire_after_expiry_is_recorded_with_both_events_in_the_new_epoch() -> None:
    """The takeover is one append: positions advance by two and the new epoch is the run's epoch."""
    history = given().opened().leased(W1).advance(TTL_US + 5)

    recorded = history.record(AcquireLease(placement(W2)), worker=W2)

    assert [(r.position, r.type, r.epoch) for r in recorded] == [(3, "LeaseExpired", 2), (4, "LeaseGranted", 2)]
    assert (history.state.epoch, history.state.holder) == (2, W2)


def test_acquire_after_release_grants_the_next_epoch_without_an_expiry() -> None:
    """A released lease leaves no holder, so the next acquire is a plain grant at epoch+1."""
    history = given().opened().leased(W1)
    history.record(ReleaseLease())

    assert history.when(AcquireLease(placement(W2)), worker=W2) == [LeaseGranted(W2, 2, placement(W2), T0 + TTL_US)]


def test_acquire_after_a_recorded_expiry_grants_the_next_epoch() -> None:
    """After LeaseExpired was recorded, even the former holder re-acquires only at a new epoch."""
    history = given().opened().leased(W1).advance(TTL_US)
    history.record(ExpireLease(), worker=W3)

    assert history.when(AcquireLease(placement(W1)), worker=W1) == [LeaseGranted(W1, 2, placement(W1), T0 + 2 * TTL_US)]


def test_acquire_for_a_placement_of_another_worker_is_malformed() -> None:
    """A worker cannot acquire a lease on behalf of another worker's placement."""
    assert given().opened().rejects(AcquireLease(placement(W2)), worker=W1).reason == "malformed"


@pytest.mark.parametrize("ttl_ms", [0, -1, MAX_TTL_MS + 1])
def test_acquire_with_ttl_outside_bounds_is_malformed(ttl_ms: int) -> None:
    """A lease ttl must be in 1..MAX_TTL_MS milliseconds."""
    assert given().opened().rejects(AcquireLease(placement(W1), ttl_ms=ttl_ms)).reason == "malformed"


@pytest.mark.parametrize(
    "capabilities",
    [("x" * (MAX_TEXT_LENGTH + 1),), tuple(f"c{i}" for i in range(MAX_LIST_ITEMS + 1))],
    ids=["long_string", "too_many_items"],
)
def test_acquire_with_a_placement_tuple_over_the_bounds_is_malformed(capabilities: tuple[str, ...]) -> None:
    """Strings and items inside a tuple field are bounded like those of a list, and nothing is stored."""
    rejection = (
        given().opened().rejects(AcquireLease(msgspec.structs.replace(placement(W1), capabilities=capabilities)))
    )
    assert rejection.reason == "malformed" and "capabilities" in str(rejection)


def test_acquire_with_the_longest_ttl_is_accepted() -> None:
    """MAX_TTL_MS itself is a legal ttl."""
    events = given().opened().when(AcquireLease(placement(W1), ttl_ms=MAX_TTL_MS))

    assert events == [LeaseGranted(W1, 1, placement(W1), T0 + MAX_TTL_MS * 1000)]


# --------------------------------------------------------------------------------------------------
# renew_lease / release_lease / expire_lease
# --------------------------------------------------------------------------------------------------


def test_holder_renew_moves_the_expiry_to_now_plus_ttl() -> None:
    """Renewing records LeaseRenewed at the same epoch with expiry counted from the store's clock."""
    history = given().opened().leased(W1).advance(seconds(10))

    assert history.when(RenewLease(ttl_ms=60_000)) == [LeaseRenewed(W1, 1, T0 + seconds(10) + 60_000_000)]


def test_a_renewed_lease_still_fences_after_the_original_expiry() -> None:
    """After a renewal, the holder's fenced submissions pass past the expiry it had before."""
    history = given().opened().leased(W1).advance(seconds(20))
    history.record(RenewLease())
    history.advance(seconds(20))  # 40 s after the grant: past the first 30 s expiry

    assert single(history.when(intent("op-1")), IntentRecorded).op_id == "op-1"


@pytest.mark.parametrize("ttl_ms", [0, MAX_TTL_MS + 1])
def test_renew_with_ttl_outside_bounds_is_malformed(ttl_ms: int) -> None:
    """A renewal ttl obeys the same bounds as an acquisition ttl."""
    assert given().opened().leased(W1).rejects(RenewLease(ttl_ms=ttl_ms)).reason == "malformed"


def test_holder_release_records_lease_released_and_leaves_no_holder() -> None:
    """Releasing records LeaseReleased at the current epoch; the run then has no holder, same epoch."""
    history = given().opened().leased(W1)

    assert history.when(ReleaseLease()) == [LeaseReleased(W1, 1)]
    history.record(ReleaseLease())
    assert (history.state.lease, history.state.epoch) == (None, 1)


def test_former_holder_after_release_is_stale_epoch() -> None:
    """Releasing gives up mutation authority: the former holder's next fenced submission is refused."""
    history = given().opened().leased(W1)
    history.record(ReleaseLease())

    err = history.rejects(intent("op-1"), worker=W1, epoch=1)

    assert isinstance(err, errors.StaleEpoch)
    assert (err.reason, err.current_epoch) == ("stale_epoch", 1)


def test_expire_lease_with_no_lease_is_no_lease() -> None:
    """There is nothing to expire on a run that has no lease."""
    assert given().opened().rejects(ExpireLease(), worker=W2).reason == "no_lease"


def test_expire_lease_before_the_expiry_is_lease_held() -> None:
    """Nobody can declare a live lease expired, whatever their own clock says."""
    history = given().opened().leased(W1).advance(TTL_US - 1)

    assert history.rejects(ExpireLease(), worker=W2).reason == "lease_held"


def test_expire_lease_at_the_expiry_by_any_worker_records_lease_expired() -> None:
    """Any worker may record that the store's clock passed the expiry; the epoch does not move."""
    history = given().opened().leased(W1).advance(TTL_US)

    assert history.when(ExpireLease(), worker=W3, epoch=0) == [LeaseExpired(W1, 1, T0 + TTL_US)]
    history.record(ExpireLease(), worker=W3, epoch=0)
    assert (history.state.lease, history.state.epoch) == (None, 1)


# --------------------------------------------------------------------------------------------------
# Lease liveness: a lease that declared a session ends early once the store sees the session gone
# --------------------------------------------------------------------------------------------------
SESSION = "pg:1767225600000000:4242:1767225600123456"


def with_session_lease(worker: str = W1) -> History:
    history = given().opened()
    history.record(AcquireLease(placement(worker), session=SESSION), worker=worker)
    return history


def test_acquire_declaring_a_session_records_it_in_the_grant() -> None:
    """The grant carries the holder's session, which the store checks when someone wants the lease."""
    events = given().opened().when(AcquireLease(placement(W1), session=SESSION), worker=W1)

    assert events == [LeaseGranted(W1, 1, placement(W1), T0 + TTL_US, SESSION)]


def test_acquire_of_a_live_lease_whose_session_the_store_saw_end_takes_it_over_at_the_next_epoch() -> None:
    """Given a live lease with a session, when the store says the holder is gone, then LeaseExpired(session_gone)
    and a grant at epoch + 1, before the ttl."""
    history = with_session_lease(W1).advance(seconds(1))

    events = history.when(AcquireLease(placement(W2)), worker=W2, holder_gone=True)

    now = T0 + seconds(1)
    assert events == [LeaseExpired(W1, 1, now, session_gone=True), LeaseGranted(W2, 2, placement(W2), now + TTL_US)]


def test_acquire_of_a_live_lease_with_a_session_the_store_did_not_see_end_is_lease_held() -> None:
    """Without the store's word, a session changes nothing: the lease lasts its ttl."""
    history = with_session_lease(W1).advance(TTL_US - 1)

    assert history.rejects(AcquireLease(placement(W2)), worker=W2).reason == "lease_held"


def test_acquire_of_a_live_lease_without_a_session_is_lease_held_even_if_the_holder_is_said_gone() -> None:
    """A lease that declared no session can only end by its ttl (or a release)."""
    history = given().opened().leased(W1)

    assert history.rejects(AcquireLease(placement(W2)), worker=W2, holder_gone=True).reason == "lease_held"


def test_expire_lease_of_a_live_lease_whose_session_ended_records_session_gone() -> None:
    """Any worker may record the early end; the epoch does not move until someone acquires."""
    history = with_session_lease(W1)

    assert history.when(ExpireLease(), worker=W3, epoch=0, holder_gone=True) == [
        LeaseExpired(W1, 1, T0, session_gone=True)
    ]
    assert history.rejects(ExpireLease(), worker=W3, epoch=0).reason == "lease_held"  # without the store's word


def test_expiry_past_the_ttl_is_not_marked_session_gone() -> None:
    """Past its ttl a lease simply expired, whatever its session: session_gone means early."""
    history = with_session_lease(W1).advance(TTL_US)

    assert history.when(AcquireLease(placement(W2)), worker=W2, holder_gone=True)[0] == LeaseExpired(W1, 1, T0 + TTL_US)


def test_session_gone_changes_nothing_for_the_holders_own_appends() -> None:
    """Liveness is asked only by takeovers: the holder's fenced commands are judged as before."""
    history = with_session_lease(W1)

    assert history.when(RenewLease(), holder_gone=True) == [LeaseRenewed(W1, 1, T0 + TTL_US)]


# --------------------------------------------------------------------------------------------------
# Fencing: stale_epoch and lease_expired
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", FENCED, ids=_fenced_id)
def test_fenced_command_from_the_previous_holder_after_takeover_is_stale_epoch(command: Command) -> None:
    """After a takeover the old holder at its old epoch is refused and told the current epoch."""
    history = given().opened().leased(W1).intended("op-1").advance(TTL_US)
    history.record(AcquireLease(placement(W2)), worker=W2)

    err = history.rejects(command, worker=W1, epoch=1)

    assert isinstance(err, errors.StaleEpoch)
    assert (err.reason, err.current_epoch) == ("stale_epoch", 2)


@pytest.mark.parametrize("command", FENCED, ids=_fenced_id)
def test_fenced_command_quoting_the_current_epoch_from_a_non_holder_is_stale_epoch(command: Command) -> None:
    """Knowing the current epoch is not enough: only the holder of that epoch may write."""
    history = given().opened().leased(W1).intended("op-1")

    err = history.rejects(command, worker=W2, epoch=1)

    assert isinstance(err, errors.StaleEpoch)
    assert err.current_epoch == 1


@pytest.mark.parametrize("epoch", [0, 2, 99])
def test_holder_quoting_a_wrong_epoch_is_stale_epoch(epoch: int) -> None:
    """The holder itself is refused when it quotes any epoch other than the current one."""
    history = given().opened().leased(W1)

    err = history.rejects(intent("op-1"), worker=W1, epoch=epoch)

    assert isinstance(err, errors.StaleEpoch)
    assert err.current_epoch == 1


def test_fenced_command_before_any_lease_is_stale_epoch_at_epoch_zero() -> None:
    """A run that never had a lease accepts no fenced command and reports epoch 0."""
    err = given().opened().rejects(intent("op-1"), worker=W1, epoch=0)

    assert isinstance(err, errors.StaleEpoch)
    assert err.current_epoch == 0


@pytest.mark.parametrize("command", FENCED, ids=_fenced_id)
def test_fenced_command_from_the_holder_after_its_expiry_is_lease_expired(command: Command) -> None:
    """The store's clock, not the worker's, decides: at the expiry the holder can no longer write."""
    history = given().opened().leased(W1).intended("op-1").advance(TTL_US)

    assert history.rejects(command, worker=W1, epoch=1).reason == "lease_expired"


# --------------------------------------------------------------------------------------------------
# record_intent
# --------------------------------------------------------------------------------------------------


def test_intent_records_context_digest_and_charges_one_call_plus_argument_bytes() -> None:
    """An intent stores its full context and digest and is charged one call and its canonical argument bytes."""
    arguments = {"path": "/tmp/x", "bytes": 12}
    history = given().opened().leased(W1)

    events = history.when(intent("op-1", arguments=arguments))

    expected_context = context("op-1", arguments)
    assert events == [
        IntentRecorded(
            "op-1",
            "effect",
            "shell@1",
            expected_context,
            context_digest(expected_context),
            "idem-op-1",
            Usage(calls=1, argument_bytes=stored_size(arguments)),
        )
    ]


def test_recorded_intent_is_uncertain_until_observed() -> None:
    """Recording an intent makes it uncertain at the epoch it was recorded in."""
    history = given().opened().leased(W1).intended("op-1")

    assert history.state.operations["op-1"].epoch == 1
    assert intended_ops(history.state) == {"op-1"}


def test_intent_whose_op_id_holds_a_nul_is_malformed() -> None:
    """Ids inside a command become keys and columns too (an op id, a placement's worker): a NUL
    in one is malformed, as in the submission's own ids."""
    history = given().opened().leased(W1)

    rejection = history.rejects(intent("op-\x001"))

    assert rejection.reason == "malformed" and "op_id" in str(rejection)


def test_intent_for_an_op_id_that_already_has_one_is_duplicate_operation() -> None:
    """An op id names one intent forever, even after it was observed."""
    history = given().opened().leased(W1).intended("op-1").observed("op-1")

    assert history.rejects(intent("op-1")).reason == "duplicate_operation"


def test_new_effect_while_an_earlier_epochs_intent_is_uncertain_is_uncertain_intent() -> None:
    """After a takeover, no new effect may start until the old epoch's uncertain intent is reconciled."""
    history = given().opened().leased(W1).intended("op-1").advance(TTL_US)
    history.record(AcquireLease(placement(W2)), worker=W2)

    assert history.rejects(intent("op-2", kind="effect"), worker=W2).reason == "uncertain_intent"


def test_pure_intent_while_an_earlier_epochs_intent_is_uncertain_is_uncertain_intent() -> None:
    """Uncertainty stops the run: a pure operation waits for the reconciliation too."""
    history = given().opened().leased(W1).intended("op-1").advance(TTL_US).leased(W2)

    assert history.rejects(intent("op-2", kind="pure"), worker=W2).reason == "uncertain_intent"


def test_a_new_intent_while_one_is_in_flight_is_uncertain_intent() -> None:
    """Until an intent's outcome is recorded, the holder may only observe it: effects run one at a time."""
    history = given().opened().leased(W1).intended("op-1")

    assert history.rejects(intent("op-2")).reason == "uncertain_intent"
    assert single(history.when(observation("op-1")), ObservationRecorded).op_id == "op-1"


@pytest.mark.parametrize(
    "command",
    [
        ReserveStage("s-1", 5),
        RecordTransition(Stage.CANDIDATE_READY, "sha256:cand"),
        SealCheckpoint("ckpt-1", "sha256:state"),
        CompleteRun("done"),
    ],
    ids=lambda c: type(c).__name__,
)
def test_while_an_intent_is_uncertain_no_stage_transition_checkpoint_or_completion_is_accepted(
    command: Command,
) -> None:
    """Given an intent without outcome, when the holder tries anything but settling it or lease upkeep,
    then it is refused uncertain_intent and nothing changes."""
    history = given().opened().leased(W1).intended("op-1")

    assert history.rejects(command).reason == "uncertain_intent"


@pytest.mark.parametrize(
    "command",
    [RenewLease(), ReleaseLease(), FailRun("gave_up"), ReconcileIntent("op-1", "abandoned", "operator call")],
    ids=lambda c: type(c).__name__,
)
def test_while_an_intent_is_uncertain_lease_upkeep_reconciliation_and_failing_are_accepted(command: Command) -> None:
    """Given an intent without outcome, the holder may still keep or give up its lease, fail, or reconcile."""
    history = given().opened().leased(W1).intended("op-1")

    assert history.when(command)


def test_new_effect_after_reconciling_the_older_intent_is_allowed() -> None:
    """Reconciling the old epoch's uncertain intent unblocks new effects."""
    history = given().opened().leased(W1).intended("op-1").advance(TTL_US).leased(W2)
    history.record(ReconcileIntent("op-1", "not_applied", "host has no record of idem-op-1"), worker=W2)

    assert single(history.when(intent("op-2"), worker=W2), IntentRecorded).op_id == "op-2"


def test_intent_with_arguments_over_the_inline_limit_is_payload_too_large() -> None:
    """Arguments whose canonical encoding passes MAX_INLINE_BYTES must be stored as a blob."""
    history = given().opened().leased(W1)

    assert history.rejects(intent("op-1", arguments={"blob": "x" * MAX_INLINE_BYTES})).reason == "payload_too_large"


def test_intent_with_arguments_exactly_at_the_inline_limit_is_accepted() -> None:
    """MAX_INLINE_BYTES of canonical arguments is still inline."""
    overhead = stored_size({"blob": ""})
    arguments = {"blob": "x" * (MAX_INLINE_BYTES - overhead)}
    history = given().opened().leased(W1)

    event = single(history.when(intent("op-1", arguments=arguments)), IntentRecorded)

    assert event.charge == Usage(calls=1, argument_bytes=MAX_INLINE_BYTES)


@pytest.mark.parametrize("arguments", [{"ratio": 0.5}, {"nested": {1: "int key"}}], ids=["float", "int_key"])
def test_intent_with_arguments_that_have_no_canonical_form_is_malformed(arguments: dict[str, object]) -> None:
    """Floats and non-string keys cannot be digested canonically, so the intent is malformed."""
    history = given().opened().leased(W1)

    assert history.rejects(intent("op-1", arguments=arguments)).reason == "malformed"


def test_intent_past_the_calls_ceiling_is_budget_exceeded() -> None:
    """With a ceiling of one call, the second intent is rejected whole."""
    history = given().opened(Ceilings(calls=1)).leased(W1).intended("op-1").observed("op-1")

    assert history.rejects(intent("op-2")).reason == "budget_exceeded"
    assert history.state.usage.calls == 1


def test_intent_reaching_the_ceiling_exactly_is_accepted() -> None:
    """A ceiling is inclusive: usage may equal it."""
    arguments = {"k": "v"}
    ceiling = stored_size(arguments)
    history = given().opened(Ceilings(calls=1, argument_bytes=ceiling)).leased(W1)

    event = single(history.when(intent("op-1", arguments=arguments)), IntentRecorded)

    assert event.charge == Usage(calls=1, argument_bytes=ceiling)


# --------------------------------------------------------------------------------------------------
# record_observation
# --------------------------------------------------------------------------------------------------


def test_ok_observation_records_outcome_and_charges_result_fuel_and_cost() -> None:
    """An observation settles its intent and is charged its inline result bytes plus reported fuel and cost."""
    result = {"exit": 0, "stdout": "ok"}
    command = observation("op-1", result=result, usage=Usage(fuel=7, cost_micros=300), evidence_refs=("ev-1",))
    history = given().opened().leased(W1).intended("op-1")

    events = history.when(command)

    assert events == [
        ObservationRecorded(
            "op-1",
            context_digest(context("op-1")),
            "ok",
            Usage(result_bytes=stored_size(result), fuel=7, cost_micros=300),
            None,
            result,
            None,
            ("ev-1",),
        )
    ]
    history.record(command)
    assert history.state.operations == {}
    assert intended_ops(history.state) == {"op-1"}


def test_failed_observation_with_a_reason_settles_the_intent_as_failed() -> None:
    """A failed outcome with a reason from the closed list is recorded and settles the intent."""
    history = given().opened().leased(W1).intended("op-1")

    history.record(observation("op-1", outcome="failed", failure_reason="timeout"))

    assert single([history.log[-1].body], ObservationRecorded).failure_reason == "timeout"
    assert "op-1" not in history.state.operations


def test_observation_charges_the_larger_of_reported_and_measured_result_bytes() -> None:
    """A blob ref's size counts as result bytes, and a larger reported figure wins."""
    ref = BlobRef("sha256:" + "b" * 64, 5_000)
    history = given().opened().leased(W1).intended("op-1")

    by_ref_events = history.when(observation("op-1", result_ref=ref, usage=Usage(result_bytes=10)))
    by_ref = single(by_ref_events, ObservationRecorded)
    by_report = single(history.when(observation("op-1", usage=Usage(result_bytes=9_000))), ObservationRecorded)

    assert by_ref.charge == Usage(result_bytes=5_000)
    assert by_report.charge == Usage(result_bytes=9_000)


@pytest.mark.parametrize(
    ("outcome", "failure_reason"), [("failed", None), ("ok", "timeout")], ids=["failed_without", "ok_with"]
)
def test_failure_reason_present_exactly_when_failed_else_malformed(outcome: str, failure_reason: str | None) -> None:
    """A failure reason is required for a failed outcome and forbidden for an ok one."""
    history = given().opened().leased(W1).intended("op-1")

    err = history.rejects(observation("op-1", outcome=outcome, failure_reason=failure_reason))

    assert err.reason == "malformed"


@pytest.mark.parametrize(
    "usage",
    [Usage(calls=1), Usage(argument_bytes=1), Usage(iterations=1), Usage(stages=1), Usage(fuel=-1)],
    ids=["calls", "argument_bytes", "iterations", "stages", "negative_fuel"],
)
def test_observation_reporting_counters_it_may_not_touch_or_negatives_is_malformed(usage: Usage) -> None:
    """An observation reports only fuel, cost and result bytes, and none of them negative."""
    history = given().opened().leased(W1).intended("op-1")

    assert history.rejects(observation("op-1", usage=usage)).reason == "malformed"


def test_observation_for_an_op_without_intent_is_unknown_operation() -> None:
    """There is no effect to observe without a recorded intent."""
    assert given().opened().leased(W1).rejects(observation("op-1")).reason == "unknown_operation"


def test_second_observation_of_the_same_op_is_already_observed() -> None:
    """An intent is settled once; a second observation is refused."""
    history = given().opened().leased(W1).intended("op-1").observed("op-1")

    assert history.rejects(observation("op-1")).reason == "already_observed"


def test_observation_of_a_reconciled_op_is_already_observed() -> None:
    """Once reconciled, an intent cannot be observed any more."""
    history = given().opened().leased(W1).intended("op-1")
    history.record(ReconcileIntent("op-1", "abandoned", "operator decision #12"))

    assert history.rejects(observation("op-1")).reason == "already_observed"


def test_observation_quoting_another_context_digest_is_context_mismatch() -> None:
    """An observation must quote exactly its intent's context digest."""
    history = given().opened().leased(W1).intended("op-1")
    other = context_digest(context("op-1", {"k": "w"}))

    assert history.rejects(observation("op-1", digest=other)).reason == "context_mismatch"


def test_observation_of_an_earlier_epochs_intent_is_reconciliation_required() -> None:
    """An intent of an earlier epoch can only be settled by reconciliation, even by its own worker."""
    history = given().opened().leased(W1).intended("op-1").advance(TTL_US)
    history.record(AcquireLease(placement(W1)), worker=W1)

    assert history.rejects(observation("op-1"), worker=W1, epoch=2).reason == "reconciliation_required"


def test_observation_with_a_result_over_the_inline_limit_is_payload_too_large() -> None:
    """Results passing MAX_INLINE_BYTES must go to the blob store."""
    history = given().opened().leased(W1).intended("op-1")

    assert history.rejects(observation("op-1", result="x" * MAX_INLINE_BYTES)).reason == "payload_too_large"


def test_observation_with_a_float_result_is_malformed() -> None:
    """A result must have a canonical encoding, so floats are refused."""
    history = given().opened().leased(W1).intended("op-1")

    assert history.rejects(observation("op-1", result={"score": 0.9})).reason == "malformed"


def test_observation_past_the_result_bytes_ceiling_is_budget_exceeded() -> None:
    """A result that would take usage past its ceiling is rejected before anything is stored."""
    history = given().opened(Ceilings(result_bytes=100)).leased(W1).intended("op-1")

    assert history.rejects(observation("op-1", usage=Usage(result_bytes=101))).reason == "budget_exceeded"
    assert "op-1" in history.state.operations


def test_observation_past_the_fuel_ceiling_is_budget_exceeded() -> None:
    """Reported fuel counts against the fuel ceiling."""
    history = given().opened(Ceilings(fuel=10)).leased(W1).intended("op-1")

    assert history.rejects(observation("op-1", usage=Usage(fuel=11))).reason == "budget_exceeded"


def test_observation_whose_fuel_would_pass_bigint_is_counter_overflow() -> None:
    """Usage counters use checked arithmetic: passing 2**63-1 is counter_overflow, never a wrap."""
    history = given().opened().leased(W1).intended("op-1")
    history.record(observation("op-1", usage=Usage(fuel=MAX_COUNTER)))
    history.intended("op-2")

    assert history.rejects(observation("op-2", usage=Usage(fuel=1))).reason == "counter_overflow"
    assert history.state.usage.fuel == MAX_COUNTER


# --------------------------------------------------------------------------------------------------
# reconcile_intent
# --------------------------------------------------------------------------------------------------


def test_reconcile_after_takeover_records_the_resolution_and_settles_the_intent() -> None:
    """The new holder settles an old uncertain intent with evidence and is charged what it reports."""
    history = given().opened().leased(W1).intended("op-1").advance(TTL_US)
    history.record(AcquireLease(placement(W2)), worker=W2)
    command = ReconcileIntent("op-1", "applied", "host log #7", result={"id": 3}, usage=Usage(fuel=4))

    events = history.when(command, worker=W2)

    expected_charge = Usage(result_bytes=stored_size({"id": 3}), fuel=4)
    assert events == [IntentReconciled("op-1", "applied", "host log #7", expected_charge, {"id": 3}, None, W2)]
    history.record(command, worker=W2)
    assert history.state.operations == {}
    assert intended_ops(history.state) == {"op-1"}


def test_reconcile_of_an_op_without_intent_is_unknown_operation() -> None:
    """Only a recorded intent can be reconciled."""
    history = given().opened().leased(W1)

    assert history.rejects(ReconcileIntent("op-9", "abandoned", "evidence")).reason == "unknown_operation"


def test_reconcile_of_an_observed_op_is_already_observed() -> None:
    """An intent that already has its observation needs no reconciliation."""
    history = given().opened().leased(W1).intended("op-1").observed("op-1")

    assert history.rejects(ReconcileIntent("op-1", "applied", "evidence")).reason == "already_observed"


def test_reconcile_without_evidence_is_malformed() -> None:
    """A reconciliation must say on what evidence it settles the intent."""
    history = given().opened().leased(W1).intended("op-1")

    assert history.rejects(ReconcileIntent("op-1", "not_applied", "")).reason == "malformed"


def test_reconcile_past_the_fuel_ceiling_is_budget_exceeded() -> None:
    """Reconciliation charges count against the ceilings like any other charge."""
    history = given().opened(Ceilings(fuel=3)).leased(W1).intended("op-1")

    err = history.rejects(ReconcileIntent("op-1", "applied", "evidence", usage=Usage(fuel=4)))

    assert err.reason == "budget_exceeded"


# --------------------------------------------------------------------------------------------------
# record_transition
# --------------------------------------------------------------------------------------------------


def test_forward_transition_records_both_stages_and_charges_nothing() -> None:
    """A legal forward move records from/to stages and the state digest; stages are counted when reserved."""
    ref = BlobRef("sha256:" + "c" * 64, 10)
    history = given().opened().leased(W1)

    events = history.when(RecordTransition(Stage.CANDIDATE_READY, "sha256:cand", ref))

    assert events == [TransitionRecorded(Stage.GENERATING, Stage.CANDIDATE_READY, "sha256:cand", Usage(), ref)]


def test_rework_to_generating_also_charges_one_iteration() -> None:
    """Sending a candidate back to GENERATING costs an iteration."""
    history = given().opened().leased(W1).moved_to(Stage.VERIFIED)

    event = single(history.when(RecordTransition(Stage.GENERATING, "sha256:redo")), TransitionRecorded)

    assert event.charge == Usage(iterations=1)


def test_skipping_a_stage_is_illegal_transition() -> None:
    """Boundaries are passed one at a time."""
    history = given().opened().leased(W1)

    assert history.rejects(RecordTransition(Stage.VERIFYING, "sha256:x")).reason == "illegal_transition"


def test_rework_after_committing_started_is_illegal_transition() -> None:
    """Once COMMITTING starts there is no way back to GENERATING."""
    history = given().opened().leased(W1).moved_to(Stage.COMMITTING)

    assert history.rejects(RecordTransition(Stage.GENERATING, "sha256:x")).reason == "illegal_transition"


def test_a_stage_reservation_past_the_stages_ceiling_is_budget_exceeded() -> None:
    """The stages ceiling bounds how many stages a run may reserve, replayed ones included."""
    history = given().opened(Ceilings(stages=2)).leased(W1)
    history.record(ReserveStage("plan", 0))
    history.record(ReserveStage("plan", 0))

    assert history.rejects(ReserveStage("act", 0)).reason == "budget_exceeded"
    assert history.state.usage.stages == 2


def test_rework_past_the_iterations_ceiling_is_budget_exceeded() -> None:
    """The iterations ceiling bounds how often a candidate may be sent back."""
    history = given().opened(Ceilings(iterations=0)).leased(W1).moved_to(Stage.CANDIDATE_READY)

    assert history.rejects(RecordTransition(Stage.GENERATING, "sha256:x")).reason == "budget_exceeded"


# --------------------------------------------------------------------------------------------------
# seal_checkpoint
# --------------------------------------------------------------------------------------------------


def test_seal_checkpoint_records_the_current_stage() -> None:
    """A checkpoint is sealed at the run's current boundary, with the caller's state digest and ref."""
    ref = BlobRef("sha256:" + "d" * 64, 99)
    history = given().opened().leased(W1).moved_to(Stage.VERIFYING).intended("op-1").observed("op-1")

    events = history.when(SealCheckpoint("ckpt-1", "sha256:state", ref))

    assert events == [CheckpointSealed("ckpt-1", Stage.VERIFYING, "sha256:state", ref)]
    history.record(SealCheckpoint("ckpt-1", "sha256:state", ref))
    assert history.state.last_checkpoint_id == "ckpt-1"


@pytest.mark.parametrize("kind", ["effect", "pure"])
def test_seal_checkpoint_with_an_uncertain_intent_is_uncertain_intent(kind: Kind) -> None:
    """A checkpoint may not freeze a state whose intent outcome is still unknown."""
    history = given().opened().leased(W1).intended("op-1", kind=kind)

    assert history.rejects(SealCheckpoint("ckpt-1", "sha256:state")).reason == "uncertain_intent"


# --------------------------------------------------------------------------------------------------
# complete_run / fail_run
# --------------------------------------------------------------------------------------------------


def test_complete_run_records_run_completed_and_closes_the_run() -> None:
    """Completing records RunCompleted; the run is then closed and has no lease."""
    history = given().opened().leased(W1).moved_to(Stage.POSTCONDITION_VERIFIED)

    assert history.when(CompleteRun("shipped")) == [RunCompleted("shipped")]
    history.record(CompleteRun("shipped"))
    assert (history.state.status, history.state.lease) == ("completed", None)


def test_complete_run_with_an_uncertain_intent_is_uncertain_intent() -> None:
    """A run cannot complete while an effect's outcome is unknown."""
    history = given().opened().leased(W1).intended("op-1")

    assert history.rejects(CompleteRun()).reason == "uncertain_intent"


def test_complete_run_while_committing_is_illegal_transition() -> None:
    """Halfway through COMMITTING the run must first record COMMITTED."""
    history = given().opened().leased(W1).moved_to(Stage.COMMITTING)

    assert history.rejects(CompleteRun()).reason == "illegal_transition"


def test_fail_run_records_run_failed_even_with_uncertain_intents() -> None:
    """Failing is always possible for the holder; the uncertain intent stays on record for audit."""
    history = given().opened().leased(W1).intended("op-1")

    assert history.when(FailRun("provider_down", "503 x3")) == [RunFailed("provider_down", "503 x3")]
    history.record(FailRun("provider_down", "503 x3"))
    assert (history.state.status, history.state.lease, list(history.state.operations)) == ("failed", None, ["op-1"])


# --------------------------------------------------------------------------------------------------
# Regressions of bugs found in review: each pins the behaviour the fix established.
# --------------------------------------------------------------------------------------------------


def test_observation_with_a_negative_result_ref_size_is_malformed() -> None:
    """A negative blob size must be refused, not netted against the inline result's bytes."""
    history = given().opened(Ceilings(result_bytes=10)).leased(W1).intended("op-1")
    command = observation("op-1", result="x" * 1000, result_ref=BlobRef("sha256:" + "f" * 64, -1003))

    assert history.rejects(command).reason == "malformed"


def test_reconcile_charges_reported_result_bytes_like_an_observation() -> None:
    """A reconciliation's reported result bytes count against the ceiling, as an observation's do."""
    history = given().opened(Ceilings(result_bytes=10)).leased(W1).intended("op-1")
    command = ReconcileIntent("op-1", "applied", "host log", usage=Usage(result_bytes=5_000))

    assert history.rejects(command).reason == "budget_exceeded"


def test_intent_with_a_huge_op_id_is_rejected() -> None:
    """Inline payloads are bounded (domain.md), so a 1 MB op id must not be stored in the log."""
    history = given().opened().leased(W1)
    huge = "o" * 1_000_000

    assert history.rejects(intent(huge)).reason in {"malformed", "payload_too_large"}


# --------------------------------------------------------------------------------------------------
# reserve_stage
# --------------------------------------------------------------------------------------------------


def test_reserve_stage_records_the_reservation_and_charges_reserved_fuel() -> None:
    """Given a leased run, when the holder reserves fuel for a stage, then StageReserved charges reserved_fuel."""
    history = given().opened().leased(W1)

    events = history.when(ReserveStage("verify-1", 250))

    assert events == [StageReserved("verify-1", 250, Usage(stages=1, reserved_fuel=250))]


def test_a_replayed_stage_reserves_again_and_nothing_is_refunded() -> None:
    """Given a stage already reserved, when it is reserved again (a replay after a move), then usage only grows."""
    history = given().opened().leased(W1)
    history.record(ReserveStage("verify-1", 250))
    history.record(ReserveStage("verify-1", 250))

    assert history.state.usage.reserved_fuel == 500


def test_reserving_past_the_reserved_fuel_ceiling_is_budget_exceeded() -> None:
    """Given a reserved_fuel ceiling, when a reservation would pass it, then it is rejected whole."""
    history = given().opened(Ceilings(reserved_fuel=300)).leased(W1)
    history.record(ReserveStage("stage-1", 200))

    assert history.rejects(ReserveStage("stage-2", 101)).reason == "budget_exceeded"


@pytest.mark.parametrize(("command", "reason"), [(ReserveStage("s", -1), "malformed")])
def test_reserve_stage_rejections(command: ReserveStage, reason: str) -> None:
    """A negative reservation is malformed."""
    assert given().opened().leased(W1).rejects(command).reason == reason


def test_reserve_stage_by_a_stale_epoch_is_refused() -> None:
    """Given a takeover, when the old holder reserves fuel, then it is stale_epoch with the current epoch."""
    history = given().opened().leased(W1).advance(seconds(60)).leased(W2)

    rejection = history.rejects(ReserveStage("s", 1), worker=W1, epoch=1)

    assert rejection.reason == "stale_epoch"
    assert getattr(rejection, "current_epoch", None) == 2


def test_op_ids_rules_hold_however_many_intents_the_run_has_had() -> None:
    """Given 300 settled intents (past the point where recent op ids are merged), when old and new ids
    come back, then each is refused for what it is and a fresh id is accepted."""
    history = given().opened().leased(W1)
    for n in range(300):
        history.intended(f"op-{n}").observed(f"op-{n}")

    assert history.rejects(intent("op-0")).reason == "duplicate_operation"
    assert history.rejects(intent("op-299")).reason == "duplicate_operation"
    assert history.rejects(observation("op-7")).reason == "already_observed"
    assert history.rejects(observation("op-300")).reason == "unknown_operation"
    assert len(intended_ops(history.state)) == 300
    history.intended("op-300")
