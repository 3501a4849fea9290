"""``decide(state, submission, now) -> events``: every rule a submission must pass.

Pure: the clock reading is an argument, so lease expiry is judged by the store's injected clock and
never by a worker's. A rejection raises; nothing about it is ever stored.
"""

from __future__ import annotations

from baton.domain import authority, errors, handoff, identity, operations, screening, threads
from baton.domain.budgets import Usage
from baton.domain.commands import (
    AbortHandoff,
    AcceptHandoff,
    AcquireLease,
    ClaimHandoff,
    CompleteRun,
    ConfirmHandoff,
    DenyApproval,
    ExpireLease,
    FailRun,
    GrantApproval,
    GrantAuthority,
    OpenRun,
    PrepareHandoff,
    PurgeThread,
    ReconcileIntent,
    RecordEvidence,
    RecordIntent,
    RecordObservation,
    RecordTransition,
    ReleaseLease,
    RenewLease,
    ReserveStage,
    ResumeFrom,
    RevokeAuthority,
    SealCheckpoint,
    Submission,
)
from baton.domain.events import (
    CheckpointSealed,
    Event,
    LeaseExpired,
    LeaseGranted,
    LeaseReleased,
    LeaseRenewed,
    PolicySet,
    ResumedFrom,
    RunCompleted,
    RunFailed,
    RunOpened,
    RunPolicy,
    StageReserved,
    TransitionRecorded,
)
from baton.domain.operations import CONTEXT_PREFIX, MAX_INLINE_BYTES, context_digest
from baton.domain.screening import MAX_ID_LENGTH, MAX_LIST_ITEMS, MAX_TEXT_LENGTH
from baton.domain.stages import Stage, is_legal
from baton.domain.state import Lease, RunState
from baton.domain.times import utc_text

__all__ = [
    "CONTEXT_PREFIX",
    "MAX_ID_LENGTH",
    "MAX_INLINE_BYTES",
    "MAX_LIST_ITEMS",
    "MAX_TEXT_LENGTH",
    "MAX_TTL_MS",
    "UNFENCED_COMMANDS",
    "context_digest",
    "decide",
    "envelope_epoch",
]

MAX_TTL_MS = 24 * 3600 * 1000


def envelope_epoch(state: RunState, submission: Submission, bodies: list[Event]) -> int:
    """The epoch a submission's events are recorded under: the submitter's, which is a lease it takes
    in this very submission (acquire, import) but not one it hands on (a handoff's ``LeaseGranted``)."""
    for body in bodies:
        if isinstance(body, LeaseGranted) and body.worker == submission.worker:
            return body.epoch
    return state.epoch


def decide(  # noqa: C901, PLR0911, PLR0912
    state: RunState, submission: Submission, now: int, *, holder_gone: bool = False
) -> list[Event]:
    """Return the events ``submission`` produces against ``state``, or raise a ``Rejection``.

    ``holder_gone``: the store has seen the liveness session of the lease's holder end (the
    holder's process died or lost the store): a lease that declared a session may then be taken
    over, or expired, before its ttl. Only the store says so, never the worker that wants the lease.
    """
    screening.check_ids(submission)
    if state.run_id and submission.run_id != state.run_id:
        raise errors.Malformed(f"submission for run {submission.run_id!r} decided against run {state.run_id!r}")
    screening.screen(submission)
    command = submission.command
    if (submission.run_id == identity.REGISTRY_RUN) != isinstance(command, identity.REGISTRY_COMMANDS):
        raise errors.Malformed(f"registry commands go to {identity.REGISTRY_RUN!r}, and only they do")
    if isinstance(command, identity.REGISTRY_COMMANDS):
        return identity.decide_registry(state, submission)
    if state.claimed_store is not None or isinstance(command, ConfirmHandoff):
        return _moved(state, submission, command)
    if isinstance(command, _UNFENCED):
        return _unfenced(state, submission, command, now, holder_gone=holder_gone)
    if isinstance(command, AcceptHandoff) and state.pending_handoff is None:
        # an import, or a refusal that does not depend on who asks (no handoff, or one already taken)
        return handoff.accept(state, submission, command, now + _ttl_us(command.ttl_ms))
    _require_run(state, submission)
    _check_fence(state, submission, now)
    if state.pending_handoff is not None and not isinstance(command, _WHILE_HANDOFF_PENDING):
        msg = f"handoff {state.pending_handoff} must be accepted (or aborted) before anything else"
        raise errors.HandoffPending(msg)
    _require_discipline(state, command)
    if isinstance(command, RecordIntent):
        if command.kind == "effect":
            authority.require_policy(state, command.tool_contract, command.context, now)
            authority.require_authority(state, submission.worker, command.context, now)
        return [operations.intent(state, command)]
    if isinstance(command, RecordObservation):
        return [operations.observation(state, command)]
    if isinstance(command, ReconcileIntent):
        return [operations.reconcile(state, submission.worker, command)]
    if isinstance(command, ResumeFrom):
        return [_resumed(state, command)]
    if isinstance(command, RecordTransition):
        return [_transition(state, command)]
    if isinstance(command, ReserveStage):
        if command.fuel < 0:
            raise errors.Malformed("fuel cannot be negative")
        # a stage counts once each time it is reserved, replayed ones too: nothing is refunded
        charge = operations.charged(state, Usage(stages=1, reserved_fuel=command.fuel))
        return [StageReserved(command.stage_id, command.fuel, charge)]
    if isinstance(command, RenewLease):
        return [LeaseRenewed(submission.worker, state.epoch, now + _ttl_us(command.ttl_ms))]
    if isinstance(command, ReleaseLease):
        return [LeaseReleased(submission.worker, state.epoch)]
    if isinstance(command, PrepareHandoff):
        return handoff.prepare(state, submission, command, now + _ttl_us(command.ttl_ms))
    if isinstance(command, AcceptHandoff):
        return handoff.accept(state, submission, command, now + _ttl_us(command.ttl_ms))
    if isinstance(command, AbortHandoff):
        return handoff.abort(state, command)
    if isinstance(command, ClaimHandoff):
        return handoff.claim(state, command)
    if isinstance(command, SealCheckpoint):
        operations.require_settled(state, "seal a checkpoint")
        return [CheckpointSealed(command.checkpoint_id, state.stage, command.state_digest, command.state_ref)]
    if isinstance(command, threads.THREAD_COMMANDS):
        return threads.decide_thread(state, command)
    if isinstance(command, CompleteRun):
        operations.require_settled(state, "complete the run")
        if state.stage is Stage.COMMITTING:
            raise errors.IllegalTransition("cannot complete while COMMITTING; record COMMITTED first")
        return [RunCompleted(command.summary)]
    if isinstance(command, FailRun):
        return [RunFailed(command.reason, command.detail)]
    msg = f"unknown command {type(command).__name__}"  # pragma: no cover - the union is closed
    raise errors.Malformed(msg)  # pragma: no cover


_FromAuthority = GrantAuthority | RevokeAuthority | GrantApproval | DenyApproval | RecordEvidence
_FROM_AUTHORITIES = (GrantAuthority, RevokeAuthority, GrantApproval, DenyApproval, RecordEvidence)
_UNFENCED = (OpenRun, PurgeThread, AcquireLease, ExpireLease, *_FROM_AUTHORITIES)
# their sender need not hold the lease (the write path names a lost race by it)
UNFENCED_COMMANDS = (*_UNFENCED, ConfirmHandoff)


def _moved(state: RunState, submission: Submission, command: object) -> list[Event]:
    """A run claimed for another store lives there: this store records the destination's
    confirmation, from the worker the run was handed to, and takes nothing else."""
    if not isinstance(command, ConfirmHandoff):
        msg = f"run {state.run_id!r} was claimed for store {state.claimed_store}: it continues there, not here"
        raise errors.AlreadyClaimed(msg)
    _require_run(state, submission, closed=True)
    if submission.worker != state.last_holder:
        msg = f"the run was handed to {state.last_holder!r}, not to {submission.worker!r}"
        raise errors.StaleEpoch(msg, current_epoch=state.epoch)
    return handoff.confirm(state, command)


_WHILE_HANDOFF_PENDING = (AcceptHandoff, AbortHandoff, ClaimHandoff, RenewLease, ReleaseLease, FailRun)
_UPKEEP = (RenewLease, ReleaseLease, FailRun, AbortHandoff, AcceptHandoff, ClaimHandoff)
# while an intent is uncertain: settling it (observing it at its epoch, or reconciling it), saying
# which prefix was replayed, and lease upkeep; no stage, store write, transition or move
_WHILE_UNCERTAIN = (RecordObservation, ReconcileIntent, ResumeFrom, *_UPKEEP)
# before a new holder's ``resume_from``: replaying reserves its stages again; a LangGraph thread's
# writes are exempt (its saver resumes from the latest checkpoint it reads, see docs/langgraph.md)
_BEFORE_REPLAY = (ResumeFrom, ReconcileIntent, ReserveStage, RecordObservation, *_UPKEEP, *threads.THREAD_COMMANDS)


def _require_discipline(state: RunState, command: object) -> None:
    """Nothing new while an outcome is unknown, and nothing new from a holder that has not replayed."""
    if state.operations and not isinstance(command, _WHILE_UNCERTAIN):
        uncertain = sorted(state.operations)
        msg = f"operations {uncertain[:5]} have no recorded outcome: observe or reconcile them first"
        raise errors.UncertainIntent(msg)
    if state.replay_required and not isinstance(command, _BEFORE_REPLAY):
        msg = (
            f"the lease changed hands: replay the prefix up to position {state.prefix_position} "
            f"and send resume_from with its digest first"
        )
        raise errors.ReplayRequired(msg)


def _resumed(state: RunState, command: ResumeFrom) -> ResumedFrom:
    """The prefix a new holder owes, or (nothing owed) the run's work so far: exactly what it names."""
    if state.replay_required:
        position, digest = state.prefix_position, state.prefix_digest
    else:
        position, digest = state.work_position, state.work_digest
    if (command.position, command.prefix_digest) != (position, digest):
        msg = (
            f"the replay prefix ends at position {position} with digest {digest}; "
            f"resume_from names position {command.position} with {command.prefix_digest}"
        )
        raise errors.PrefixMismatch(msg)
    return ResumedFrom(position, digest)


def _unfenced(
    state: RunState,
    submission: Submission,
    command: OpenRun | PurgeThread | AcquireLease | ExpireLease | _FromAuthority,
    now: int,
    *,
    holder_gone: bool,
) -> list[Event]:
    """Commands whose sender need not hold the lease: to open, erase, take over, or grant."""
    if isinstance(command, OpenRun):
        return _open(state, command)
    if isinstance(command, PurgeThread):  # erasure is an operator's duty, also on a closed run
        _require_run(state, submission, closed=True)
        return threads.decide_purge(state, command)
    _require_run(state, submission)
    if isinstance(command, AcquireLease):
        return _acquire(state, submission, command, now, holder_gone=holder_gone)
    if isinstance(command, ExpireLease):
        return _expire(state, now, holder_gone=holder_gone)
    return [_from_authority(state, submission, command, now)]


def _require_run(state: RunState, submission: Submission, *, closed: bool = False) -> None:
    """The run exists and, unless ``closed`` ones will do, is neither completed nor failed."""
    if not state.opened:
        raise errors.RunNotFound(f"run {submission.run_id!r} does not exist")
    if state.closed and not closed:
        raise errors.RunClosed(f"run {state.run_id!r} is {state.status}")


def _from_authority(state: RunState, submission: Submission, command: _FromAuthority, now: int) -> Event:
    """Grants, approvals and verifier evidence come from someone other than the holder, so they are not fenced."""
    if isinstance(command, GrantAuthority):
        return authority.grant(state, submission, command, now)
    if isinstance(command, RevokeAuthority):
        return authority.revoke(state, command)
    if isinstance(command, GrantApproval):
        return authority.approve(state, submission, command, now)
    if isinstance(command, RecordEvidence):
        return authority.record_evidence(state, submission, command)
    return authority.deny(state, submission, command)


def _ttl_us(ttl_ms: int) -> int:
    if not 0 < ttl_ms <= MAX_TTL_MS:
        msg = f"ttl_ms must be in 1..{MAX_TTL_MS}"
        raise errors.Malformed(msg)
    return ttl_ms * 1000


def _open(state: RunState, command: OpenRun) -> list[Event]:
    if state.opened:
        raise errors.RunAlreadyExists(f"run {state.run_id!r} already exists")
    command.ceilings.validate()
    if command.schema_version < 0:
        raise errors.Malformed("schema_version cannot be negative")
    opened = RunOpened(
        command.release_id, command.schema_name, command.schema_version, command.task_ref, command.ceilings
    )
    # a run without a policy opens with one event, as runs did before policies
    return [opened] if command.policy == RunPolicy() else [opened, PolicySet(command.policy)]


def _acquire(
    state: RunState, submission: Submission, command: AcquireLease, now: int, *, holder_gone: bool
) -> list[Event]:
    if command.placement.worker != submission.worker:
        raise errors.Malformed("placement.worker must be the submitting worker")
    expires_at = now + _ttl_us(command.ttl_ms)
    events: list[Event] = []
    if state.lease is not None:
        events.append(_ended(state.lease, now, holder_gone=holder_gone))
    events.append(LeaseGranted(submission.worker, state.epoch + 1, command.placement, expires_at, command.session))
    return events


def _expire(state: RunState, now: int, *, holder_gone: bool) -> list[Event]:
    if state.lease is None:
        raise errors.NoLease(f"run {state.run_id!r} has no lease to expire")
    return [_ended(state.lease, now, holder_gone=holder_gone)]


def _ended(lease: Lease, now: int, *, holder_gone: bool) -> LeaseExpired:
    """The lease's end: past its ttl, or earlier when it declared a session the store saw end."""
    if now >= lease.expires_at:
        return LeaseExpired(lease.worker, lease.epoch, now)
    if holder_gone and lease.session:
        return LeaseExpired(lease.worker, lease.epoch, now, session_gone=True)
    msg = f"lease epoch {lease.epoch} is held by {lease.worker!r} until {utc_text(lease.expires_at)}"
    raise errors.LeaseHeld(msg)


def _check_fence(state: RunState, submission: Submission, now: int) -> None:
    lease = state.lease
    if lease is None or submission.epoch != state.epoch or lease.worker != submission.worker:
        msg = (
            f"{submission.worker!r} at epoch {submission.epoch} does not hold the lease "
            f"(current epoch {state.epoch}, holder {state.holder!r})"
        )
        raise errors.StaleEpoch(msg, current_epoch=state.epoch)
    if now >= lease.expires_at:
        raise errors.LeaseExpired(f"lease epoch {lease.epoch} expired at {utc_text(lease.expires_at)}")


def _transition(state: RunState, command: RecordTransition) -> TransitionRecorded:
    if not is_legal(state.stage, command.to_stage):
        raise errors.IllegalTransition(f"{state.stage} -> {command.to_stage} is not a legal move")
    rework = 1 if command.to_stage is Stage.GENERATING else 0
    charge = operations.charged(state, Usage(iterations=rework))  # stages are counted when reserved
    return TransitionRecorded(state.stage, command.to_stage, command.state_digest, charge, command.state_ref)
