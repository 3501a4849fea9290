"""The audit's handoff rules: what ``domain.handoff`` enforces, checked again on the stored log.

In one store the source prepares (``HandoffPrepared``, then ``LeaseGranted`` to the destination in
the same submission, both at the source's epoch; ``projections.audit_rules.granted`` knows that
lease move); the destination accepts exactly the prepared digest before any work of its own, or the
holder aborts. A run continued from another store starts with ``HandoffAccepted(imported=True)``:
that first event opens it with the usage it carried. One predecessor has at most one successor.
"""

from __future__ import annotations

import msgspec

from baton.domain.events import HandoffAborted, HandoffAccepted, HandoffPrepared, RecordedEvent
from baton.projections.audit_rules import check_ceilings, fenced, require_settled
from baton.projections.audit_state import AuditState, PendingHandoff

__all__ = ["aborted", "accepted", "not_pending", "prepared"]


def claimed(s: AuditState, e: RecordedEvent) -> None:
    """From a claim on, the run continues in the store it was claimed for (``after_claim`` otherwise)."""
    s.claimed = e.position


def not_pending(s: AuditState, e: RecordedEvent) -> None:
    """While a handoff is prepared, the holder may only accept or abort it (renew, release, fail)."""
    pending = s.pending
    if pending is not None and s.holds(e.worker, e.epoch):
        s.report(
            "handoff_pending",
            f"{e.type} from {e.worker!r} while handoff {pending.digest} (prepared at {pending.position}) was pending",
        )


def prepared(s: AuditState, e: RecordedEvent) -> None:
    body: HandoffPrepared = e.body  # type: ignore[assignment]
    require_settled(s, e)
    if body.predecessor_digest != s.handoff_digest:
        s.report(
            "handoff_mismatch",
            f"the document continues from {body.predecessor_digest}; the run's last handoff is {s.handoff_digest}",
        )
    s.pending = PendingHandoff(body.document_digest, body.destination.worker, e.epoch, e.position, e.submission_id)


def accepted(s: AuditState, e: RecordedEvent) -> None:
    body: HandoffAccepted = e.body  # type: ignore[assignment]
    if body.imported:
        _imported(s, e, body)
        return
    fenced(s, e)
    pending, last = s.pending, s.handoff
    if last is not None and last[0] == body.document_digest:
        s.report("second_successor", f"handoff {body.document_digest} was already accepted at position {last[1]}")
    elif pending is None:
        s.report("second_successor", f"handoff {body.document_digest} accepted, but no handoff was pending")
    elif pending.digest != body.document_digest:
        s.report("handoff_mismatch", f"accepts {body.document_digest}; the prepared handoff is {pending.digest}")
    else:
        _matches(s, e, body, pending)
    s.pending = None
    s.handoff = (body.document_digest, e.position)


def _matches(s: AuditState, e: RecordedEvent, body: HandoffAccepted, pending: PendingHandoff) -> None:
    """The acceptance of the prepared document: by its destination, restating what the run was."""
    carried = list(msgspec.structs.astuple(body.carried))
    checks = [
        (e.worker == pending.destination, f"accepted by {e.worker!r}; the document hands the run to the destination"),
        (e.epoch > pending.epoch, f"accepted at epoch {e.epoch}, not after the source's epoch {pending.epoch}"),
        (body.source_epoch == pending.epoch, f"source_epoch {body.source_epoch}; it was prepared at {pending.epoch}"),
        (body.predecessor_digest == s.handoff_digest, f"predecessor {body.predecessor_digest} is not the run's last"),
        (carried == s.usage, "carried usage is not the run's usage"),
    ]
    failed = [message for ok, message in checks if not ok]
    if failed:
        s.report("handoff_mismatch", f"{pending.destination!r} at handoff {pending.digest}: " + "; ".join(failed))


def _imported(s: AuditState, e: RecordedEvent, body: HandoffAccepted) -> None:
    """The first event of a run continued from another store opens it with what the run carried."""
    if s.opened or e.position != 1:
        where = "the run was already opened" if s.opened else f"at position {e.position}, not as the first event"
        s.report("duplicate_open", f"imported handoff {body.document_digest}: {where}")
        if s.opened:
            return
    s.opened = True
    s.release_id = body.release_id
    s.epoch = body.source_epoch
    s.stage = body.stage
    s.usage = list(msgspec.structs.astuple(body.carried))
    s.limits = tuple(
        (index, ceiling) for index, ceiling in enumerate(msgspec.structs.astuple(body.ceilings)) if ceiling is not None
    )
    check_ceilings(s)
    s.handoff = (body.document_digest, e.position)


def aborted(s: AuditState, e: RecordedEvent) -> None:
    body: HandoffAborted = e.body  # type: ignore[assignment]
    pending = s.pending
    if pending is None:
        s.report("handoff_mismatch", f"aborts {body.document_digest}, but no handoff was pending")
    elif pending.digest != body.document_digest:
        s.report("handoff_mismatch", f"aborts {body.document_digest}; the prepared handoff is {pending.digest}")
    s.pending = None
