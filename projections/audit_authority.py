"""The audit's authority rules: what ``domain.authority`` enforces, checked again on the stored log.

Grants bind the live lease (worker, epoch), come from someone other than the holder and die with
the epoch (``projections.audit_rules.granted`` drops them). Approvals bind one artifact digest and
expire; evidence binds the workspace snapshot and environment (the run's release) it ran in. An
effect naming a grant, or committing a proposal, needs them live when it is recorded. A grant or
approval the log should never have held (self-authorized, unbound) authorizes nothing.
"""

from __future__ import annotations

from baton.domain.authority import require_authority, require_policy
from baton.domain.errors import Rejection
from baton.domain.events import (
    ApprovalDenied,
    ApprovalGranted,
    AuthorityGranted,
    AuthorityRevoked,
    EvidenceRecorded,
    IntentRecorded,
    PolicySet,
    RecordedEvent,
)
from baton.domain.state import Approval, Evidence, Grant
from baton.domain.times import utc_text
from baton.projections.audit_state import AuditState

__all__ = ["approval_denied", "approval_granted", "authority_granted", "authority_revoked", "authorized", "evidence"]


def _from_holder(s: AuditState, e: RecordedEvent, *named: str) -> bool:
    """Whether the submitter (or a worker the event names as its author) holds the lease: self-authorization."""
    holder = s.lease.worker if s.lease else None
    if holder is not None and holder in (e.worker, *named):
        s.report("self_authorization", f"{e.type} from the lease holder {holder!r}")
        return True
    return False


def authority_granted(s: AuditState, e: RecordedEvent) -> None:
    body: AuthorityGranted = e.body  # type: ignore[assignment]
    selfish = _from_holder(s, e, body.granted_by)
    lease = s.lease
    if lease is None or (lease.worker, lease.epoch) != (body.worker, body.epoch) or e.recorded_at >= lease.expires_at:
        live = (
            f"{lease.worker!r} held epoch {lease.epoch} until {utc_text(lease.expires_at)}"
            if lease
            else "no lease was held"
        )
        s.report("grant_unbound", f"grant {body.grant_id!r} for {body.worker!r} at epoch {body.epoch}; {live}")
        return
    if not selfish:
        s.grants[body.grant_id] = Grant(body.capability, body.worker, body.epoch, body.expires_at)


def authority_revoked(s: AuditState, e: RecordedEvent) -> None:
    body: AuthorityRevoked = e.body  # type: ignore[assignment]
    if s.grants.pop(body.grant_id, None) is None:
        s.report("authority_missing", f"revokes grant {body.grant_id!r}, which is not live")


def approval_granted(s: AuditState, e: RecordedEvent) -> None:
    body: ApprovalGranted = e.body  # type: ignore[assignment]
    if not _from_holder(s, e, body.approver):
        s.approvals[body.artifact_digest] = Approval(
            body.approval_id, body.approver, body.scope, body.expires_at, e.epoch
        )


def approval_denied(s: AuditState, e: RecordedEvent) -> None:
    body: ApprovalDenied = e.body  # type: ignore[assignment]
    _from_holder(s, e, body.approver)
    s.approvals.pop(body.artifact_digest, None)


def evidence(s: AuditState, e: RecordedEvent) -> None:
    body: EvidenceRecorded = e.body  # type: ignore[assignment]
    if _from_holder(s, e):  # a verifier's verdict, never the holder's on its own work
        return
    record = Evidence(body.evidence_id, body.workspace_snapshot, body.environment, body.verdict)
    s.evidence[body.artifact_digest] = record


def policy_set(s: AuditState, e: RecordedEvent) -> None:
    body: PolicySet = e.body  # type: ignore[assignment]
    s.policy = body.policy


def authorized(s: AuditState, e: RecordedEvent) -> None:
    """An effect needs the grant it names, and for a proposal an approval and evidence for exactly it."""
    body: IntentRecorded = e.body  # type: ignore[assignment]
    if body.kind != "effect":
        return
    try:  # the domain's own rule, on the audit's view of the run: one definition of "authorized"
        require_policy(s, body.tool_contract, body.context, e.recorded_at)
        require_authority(s, e.worker, body.context, e.recorded_at)
    except Rejection as refusal:
        s.report(refusal.reason, f"effect {body.op_id!r}: {refusal.message}")
