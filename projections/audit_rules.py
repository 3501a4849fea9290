"""The audit's rules for the run's life, fencing, operations, budgets and stages: what ``decide`` enforces.

Each rule checks one event against ``AuditState`` (the run before it), reports what it finds and
keeps the state current. Handoff and authority rules live in ``projections.audit_handoff`` and
``projections.audit_authority``; ``projections.audit.RULES`` maps each body type to its rules.
"""

from __future__ import annotations

from operator import add

import msgspec

from baton.domain.budgets import COUNTERS, MAX_COUNTER, Usage
from baton.domain.decide import context_digest
from baton.domain.events import (
    CheckpointSealed,
    HandoffAccepted,
    HandoffConfirmed,
    IntentRecorded,
    LeaseExpired,
    LeaseGranted,
    LeaseReleased,
    LeaseRenewed,
    ObservationRecorded,
    RecordedEvent,
    RegistryOpened,
    RunOpened,
    ThreadDeleted,
    ThreadPurged,
    TransitionRecorded,
)
from baton.domain.stages import Stage, is_legal
from baton.domain.threads import PURGE_TOMBSTONE
from baton.domain.times import utc_text
from baton.projections.audit_state import AuditState, LeaseRecord, OpRecord

__all__ = [
    "charge",
    "check_ceilings",
    "checkpoint",
    "completed",
    "ended",
    "expired",
    "fenced",
    "granted",
    "intent",
    "lifecycle",
    "observed",
    "opened",
    "reconciled",
    "released",
    "renewed",
    "require_settled",
    "transition",
    "unfinished_erasure",
]


# -- rules for every event ----------------------------------------------------------------------


def _erasure(s: AuditState, e: RecordedEvent) -> bool:
    """Whether ``e``, after the end, is part of a purge: an operator may erase a thread's blobs on an
    ended run too (``PurgeThread``), which appends a tombstone and then the record naming it. A
    tombstone not followed by its record is reported after all (``AuditFold.finish`` for the last event)."""
    body = e.body
    if s.erasing is not None:
        tombstone, s.erasing = s.erasing, None
        if isinstance(body, ThreadPurged) and body.upto == tombstone == e.position - 1:
            return True
        unfinished_erasure(s, tombstone)
    if isinstance(body, ThreadDeleted) and body.reason.startswith(PURGE_TOMBSTONE):
        s.erasing = e.position
        return True
    return False


def unfinished_erasure(s: AuditState, tombstone: int) -> None:
    s.report("after_terminal", "a purge's tombstone after the run ended, without its ThreadPurged record", tombstone)


def lifecycle(s: AuditState, e: RecordedEvent) -> None:
    if s.terminal is not None and not _erasure(s, e):
        s.report("after_terminal", f"{e.type} after the run ended at position {s.terminal}")
    if s.claimed is not None and not isinstance(e.body, HandoffConfirmed):
        s.report("after_claim", f"{e.type} after the handoff was claimed for another store at {s.claimed}")
    if not s.opened and not (
        isinstance(e.body, RunOpened | RegistryOpened) or (isinstance(e.body, HandoffAccepted) and e.body.imported)
    ):
        s.report("not_opened", f"{e.type} before RunOpened")
    if e.epoch < s.epoch:
        s.report("stale_epoch", f"{e.type} from {e.worker!r} at epoch {e.epoch}; the run was at epoch {s.epoch}")


def fenced(s: AuditState, e: RecordedEvent) -> None:
    """The fence ``decide`` applies: the submitter holds the live lease of the current epoch."""
    lease = s.lease
    if e.epoch < s.epoch:
        return  # already reported as stale_epoch
    if lease is None or lease.worker != e.worker or lease.epoch != e.epoch:
        held = f"{lease.worker!r} held epoch {lease.epoch}" if lease else f"no lease was held (epoch {s.epoch})"
        s.report("not_lease_holder", f"{e.type} from {e.worker!r} at epoch {e.epoch}, but {held}")
    elif e.recorded_at >= lease.expires_at:
        s.report(
            "lease_expired",
            f"{e.type} recorded at {utc_text(e.recorded_at)}; "
            f"lease epoch {lease.epoch} expired at {utc_text(lease.expires_at)}",
        )


def charge(s: AuditState, e: RecordedEvent) -> None:
    charged: Usage = e.body.charge  # type: ignore[union-attr]  # only registered for bodies with a charge
    amounts = msgspec.structs.astuple(charged)
    if min(amounts) < 0:
        _charge_negative(s, amounts)
        return
    usage = s.usage  # one counter each: Usage has a fixed shape
    for index, amount in enumerate(amounts):
        total = usage[index] = usage[index] + amount
        if total > MAX_COUNTER and total - amount <= MAX_COUNTER:  # reported when it first passes
            s.report("counter_overflow", f"{COUNTERS[index]} reached {total}")
    if s.limits:
        check_ceilings(s)


def _charge_negative(s: AuditState, amounts: tuple[int, ...]) -> None:
    for index, amount in enumerate(amounts):
        if amount < 0:
            s.report("budget_decreased", f"{COUNTERS[index]} charged {amount}")
    amounts = tuple(max(amount, 0) for amount in amounts)
    usage = s.usage = list(map(add, s.usage, amounts))
    if max(usage) > MAX_COUNTER:
        for index, total in enumerate(usage):
            if total > MAX_COUNTER and total - amounts[index] <= MAX_COUNTER:  # reported when it first passes
                s.report("counter_overflow", f"{COUNTERS[index]} reached {total}")
    if s.limits:
        check_ceilings(s)


def check_ceilings(s: AuditState) -> None:
    usage = s.usage
    for index, ceiling in s.limits:
        if usage[index] > ceiling and index not in s.exceeded:
            s.exceeded.add(index)  # reported once per counter: every later event would repeat it
            s.report("budget_exceeded", f"{COUNTERS[index]} {usage[index]} > ceiling {ceiling}")


# -- the run's life and its lease -----------------------------------------------------------------


def opened(s: AuditState, e: RecordedEvent) -> None:
    if s.opened:
        s.report("duplicate_open", "the run was already opened")
        return
    s.opened = True
    if not isinstance(e.body, RunOpened):
        return  # the registry's opening: no release, no ceilings
    body = e.body
    s.release_id = body.release_id
    s.limits = tuple(
        (index, ceiling) for index, ceiling in enumerate(msgspec.structs.astuple(body.ceilings)) if ceiling is not None
    )


def _handed_on(s: AuditState, e: RecordedEvent, body: LeaseGranted) -> bool:
    """Is this the lease move a handoff's source appends right after its HandoffPrepared, in the same
    submission and at its own epoch (``domain.decide.envelope_epoch``), to the prepared destination?"""
    pending = s.pending
    return (
        pending is not None
        and pending.position == e.position - 1
        and pending.submission_id == e.submission_id
        and pending.destination == body.worker
        and s.holds(e.worker, e.epoch)
    )


def granted(s: AuditState, e: RecordedEvent) -> None:
    body: LeaseGranted = e.body  # type: ignore[assignment]
    handed_on = _handed_on(s, e, body)  # the source's live lease moves: it is not "held" against the grant
    if s.lease is not None and not handed_on:
        s.report("lease_held", f"epoch {body.epoch} granted while {s.lease.worker!r} held epoch {s.lease.epoch}")
    envelope_epoch = body.epoch - 1 if handed_on else body.epoch
    if body.epoch <= s.epoch or e.epoch != envelope_epoch:
        s.report(
            "epoch_not_increasing",
            f"grant of epoch {body.epoch} (envelope epoch {e.epoch}) after epoch {s.epoch}",
        )
    s.epoch = max(s.epoch, body.epoch)
    s.lease = LeaseRecord(body.worker, body.epoch, body.expires_at, body.session)
    s.grants.clear()  # grants are bound to (worker, epoch): a new epoch starts with none


def _lease_named(s: AuditState, e: RecordedEvent) -> bool:
    body: LeaseRenewed | LeaseReleased | LeaseExpired = e.body  # type: ignore[assignment]
    lease = s.lease
    if lease is None or (body.worker, body.epoch) != (lease.worker, lease.epoch):
        current = f"{lease.worker!r} at epoch {lease.epoch}" if lease else "no lease"
        s.report("lease_mismatch", f"{e.type} names {body.worker!r} at epoch {body.epoch}; current: {current}")
        return False
    return True


def renewed(s: AuditState, e: RecordedEvent) -> None:
    body: LeaseRenewed = e.body  # type: ignore[assignment]
    if _lease_named(s, e) and s.lease is not None:
        s.lease = msgspec.structs.replace(s.lease, expires_at=body.expires_at)


def released(s: AuditState, e: RecordedEvent) -> None:
    _lease_named(s, e)
    s.lease = None


def expired(s: AuditState, e: RecordedEvent) -> None:
    """A lease ends at its expiry, or earlier only if it declared a liveness session that the store
    saw end (``session_gone``: the store's testimony, as the expiry time is the store's clock's)."""
    body: LeaseExpired = e.body  # type: ignore[assignment]
    lease = s.lease
    early = lease is not None and body.expired_at < lease.expires_at
    if _lease_named(s, e) and lease is not None and early and not (body.session_gone and lease.session):
        s.report(
            "premature_expiry",
            f"expired at {utc_text(body.expired_at)}, before its expiry {utc_text(lease.expires_at)}",
        )
    s.lease = None


# -- operations, stages and the end ---------------------------------------------------------------


def _older_open(s: AuditState) -> list[int]:
    return sorted(epoch for epoch, count in s.open_by_epoch.items() if count and epoch < s.epoch)


def intent(s: AuditState, e: RecordedEvent) -> None:
    body: IntentRecorded = e.body  # type: ignore[assignment]
    if body.op_id in s.operations:
        s.report(
            "duplicate_operation", f"{body.op_id!r} already has an open intent at {s.operations[body.op_id].position}"
        )
        return
    if not _quotes_its_context(body):
        s.report("context_digest_mismatch", f"{body.op_id!r} quotes {body.context_digest}")
    if body.kind == "effect" and (older := _older_open(s)):
        s.report("uncertain_intent", f"effect {body.op_id!r} while intents of epochs {older} were uncertain")
    s.operations[body.op_id] = OpRecord(body.kind, body.context_digest, e.epoch, e.position)
    s.open_by_epoch[e.epoch] = s.open_by_epoch.get(e.epoch, 0) + 1


def _quotes_its_context(body: IntentRecorded) -> bool:
    try:
        return context_digest(body.context) == body.context_digest
    except (TypeError, ValueError):  # a context with no canonical form (a float, say) has no digest to quote
        return False


def _settle(s: AuditState, e: RecordedEvent) -> OpRecord | None:
    op_id: str = e.body.op_id  # type: ignore[union-attr]
    op = s.operations.pop(op_id, None)
    if op is None:
        s.report("unknown_operation", f"{e.type} for {op_id!r}, which has no open intent in this run")
        return None
    s.open_by_epoch[op.epoch] -= 1
    return op


def observed(s: AuditState, e: RecordedEvent) -> None:
    body: ObservationRecorded = e.body  # type: ignore[assignment]
    op = _settle(s, e)
    if op is None:
        return
    if op.epoch != e.epoch:
        s.report("reconciliation_required", f"{body.op_id!r} was intended at epoch {op.epoch}, observed at {e.epoch}")
    if body.context_digest != op.context_digest:
        s.report(
            "context_mismatch",
            f"{body.op_id!r} quotes {body.context_digest}; the intent at {op.position} recorded {op.context_digest}",
        )


def reconciled(s: AuditState, e: RecordedEvent) -> None:
    _settle(s, e)


def transition(s: AuditState, e: RecordedEvent) -> None:
    body: TransitionRecorded = e.body  # type: ignore[assignment]
    if body.from_stage != s.stage:
        s.report("stage_mismatch", f"transition from {body.from_stage} while the run was in {s.stage}")
    if not is_legal(s.stage, body.to_stage):
        s.report("illegal_transition", f"{s.stage} -> {body.to_stage}")
    s.stage = body.to_stage


def require_settled(s: AuditState, e: RecordedEvent) -> None:
    if s.operations:
        names = sorted(s.operations)[:5]
        s.report("uncertain_intent", f"{e.type} with {len(s.operations)} uncertain intents, e.g. {names}")


def checkpoint(s: AuditState, e: RecordedEvent) -> None:
    body: CheckpointSealed = e.body  # type: ignore[assignment]
    if body.stage != s.stage:
        s.report("stage_mismatch", f"checkpoint at {body.stage} while the run was in {s.stage}")
    require_settled(s, e)


def completed(s: AuditState, e: RecordedEvent) -> None:
    require_settled(s, e)
    if s.stage is Stage.COMMITTING:
        s.report("illegal_transition", "completed while COMMITTING")
    ended(s, e)


def ended(s: AuditState, e: RecordedEvent) -> None:
    if s.terminal is None:
        s.terminal = e.position
    s.lease = None
