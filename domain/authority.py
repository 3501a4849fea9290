"""Authority by reference, approvals and evidence bound to exact artifacts, and the mutation gateway.

* A grant names a capability *reference* for one (worker, epoch); it dies when the epoch advances,
  so a destination needs fresh grants of its own. Nobody grants themselves anything: grants and
  approvals come from someone other than the lease holder.
* An approval for artifact P authorizes committing P, never P'. An effect that commits a proposal
  (``context.proposal_digest``) needs an unexpired approval and passing verifier evidence for exactly
  that digest; evidence binds the workspace snapshot and environment it ran in, and a different
  binding needs verifying again.
* ``gate`` answers an external system's question "may W at epoch E perform O now?"; ``gate_key``
  the same question asked by the idempotency key the system was given.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Protocol

import msgspec

from baton.domain import errors
from baton.domain.commands import (
    DenyApproval,
    GrantApproval,
    GrantAuthority,
    RecordEvidence,
    RevokeAuthority,
    Submission,
)
from baton.domain.events import (
    ApprovalDenied,
    ApprovalGranted,
    AuthorityGranted,
    AuthorityRevoked,
    EvidenceRecorded,
    IntentContext,
    RunPolicy,
)
from baton.domain.state import Approval, Evidence, Grant, RunState, intended, key_used
from baton.domain.times import utc_text

__all__ = [
    "AuthorityView",
    "GateDecision",
    "approve",
    "deny",
    "gate",
    "gate_key",
    "grant",
    "record_evidence",
    "require_authority",
    "require_policy",
    "revoke",
]

MAX_GRANT_TTL_MS = 7 * 24 * 3_600_000


class AuthorityView(Protocol):
    """What ``require_authority`` reads: the write side's ``RunState``, or the auditor's fold state."""

    @property
    def epoch(self) -> int: ...
    @property
    def release_id(self) -> str: ...
    @property
    def grants(self) -> Mapping[str, Grant]: ...
    @property
    def approvals(self) -> Mapping[str, Approval]: ...
    @property
    def evidence(self) -> Mapping[str, Evidence]: ...
    @property
    def policy(self) -> RunPolicy: ...


class GateDecision(msgspec.Struct, frozen=True):
    allowed: bool
    reason: str  # "allowed" or the reason code a submission would be refused with
    detail: str


def _not_the_holder(state: RunState, submission: Submission, what: str) -> None:
    if submission.worker == state.holder:
        raise errors.SelfAuthorization(f"the lease holder {submission.worker!r} cannot {what} itself")


def _expiry(now: int, ttl_ms: int | None) -> int | None:
    if ttl_ms is None:
        return None
    if not 0 < ttl_ms <= MAX_GRANT_TTL_MS:
        raise errors.Malformed(f"ttl_ms must be in 1..{MAX_GRANT_TTL_MS}")
    return now + ttl_ms * 1000


def grant(state: RunState, submission: Submission, command: GrantAuthority, now: int) -> AuthorityGranted:
    _not_the_holder(state, submission, "grant authority to")
    lease = state.lease
    if lease is None or (lease.worker, lease.epoch) != (command.worker, command.epoch) or now >= lease.expires_at:
        msg = f"grants bind the live lease: {command.worker!r} does not hold epoch {command.epoch}"
        raise errors.StaleEpoch(msg, current_epoch=state.epoch)
    if command.grant_id in state.grants:
        raise errors.Malformed(f"grant {command.grant_id!r} already exists at this epoch")
    expires_at = _expiry(now, command.ttl_ms)
    return AuthorityGranted(
        command.grant_id, command.capability, command.worker, command.epoch, submission.worker, expires_at
    )


def revoke(state: RunState, command: RevokeAuthority) -> AuthorityRevoked:
    if command.grant_id not in state.grants:
        raise errors.AuthorityMissing(f"no live grant {command.grant_id!r} to revoke")
    return AuthorityRevoked(command.grant_id, command.reason)


def record_evidence(state: RunState, submission: Submission, command: RecordEvidence) -> EvidenceRecorded:
    """A verifier's verdict on an artifact: never the lease holder's about its own work."""
    _not_the_holder(state, submission, "record verifier evidence for")
    return EvidenceRecorded(
        command.evidence_id,
        command.artifact_digest,
        command.workspace_snapshot,
        command.environment,
        command.verdict,
        command.evidence_ref,
    )


def approve(state: RunState, submission: Submission, command: GrantApproval, now: int) -> ApprovalGranted:
    _not_the_holder(state, submission, "approve an artifact for")
    expires_at = _expiry(now, command.ttl_ms)
    assert expires_at is not None  # ttl_ms is required for approvals
    return ApprovalGranted(command.approval_id, command.artifact_digest, submission.worker, command.scope, expires_at)


def deny(state: RunState, submission: Submission, command: DenyApproval) -> ApprovalDenied:
    _not_the_holder(state, submission, "deny an artifact for")
    return ApprovalDenied(command.approval_id, command.artifact_digest, submission.worker, command.reason)


def require_authority(state: AuthorityView, worker: str, context: IntentContext, now: int) -> None:
    """What an effect intent needs: a live grant it names, and for a proposal, approval and evidence."""
    if context.authorization:
        live = state.grants.get(context.authorization)
        if live is None or (live.worker, live.epoch) != (worker, state.epoch):
            msg = f"grant {context.authorization!r} is not held by {worker!r} at epoch {state.epoch}: get a fresh grant"
            raise errors.AuthorityMissing(msg)
        if live.expires_at is not None and now >= live.expires_at:
            raise errors.AuthorityMissing(f"grant {context.authorization!r} expired at {utc_text(live.expires_at)}")
    proposal = context.proposal_digest
    if not proposal:
        return
    approval = state.approvals.get(proposal)
    if approval is None or now >= approval.expires_at:
        approved = sorted(d for d, a in state.approvals.items() if now < a.expires_at) or ["nothing"]
        msg = f"artifact {proposal} is not approved (approved: {', '.join(approved)})"
        raise errors.ApprovalMismatch(msg)
    evidence = state.evidence.get(proposal)
    if evidence is None or evidence.verdict != "pass":
        raise errors.ReverificationRequired(f"artifact {proposal} has no passing verifier evidence")
    environment = state.release_id  # the release the run executes under is the environment evidence binds
    if context.state_digest and context.state_digest != evidence.workspace_snapshot:
        msg = (
            f"evidence {evidence.evidence_id} verified workspace {evidence.workspace_snapshot}, "
            f"the effect runs in {context.state_digest}: verify again"
        )
        raise errors.ReverificationRequired(msg)
    if evidence.environment != environment:
        msg = (
            f"evidence {evidence.evidence_id} ran in environment {evidence.environment!r}, "
            f"the run executes release {environment!r}: verify again"
        )
        raise errors.ReverificationRequired(msg)


def require_policy(state: AuthorityView, tool_contract: str, context: IntentContext, now: int) -> None:
    """What the run's policy needs of an effect under ``tool_contract``: it names the proposal it
    commits, and a live approval of, and passing evidence for, exactly that proposal exist
    (``ApprovalMissing``, ``EvidenceMissing``). Whether they bind the workspace and release is
    ``require_authority``'s to say."""
    policy = state.policy
    needs_approval = any(fnmatch.fnmatchcase(tool_contract, p) for p in policy.approval_required)
    needs_evidence = any(fnmatch.fnmatchcase(tool_contract, p) for p in policy.evidence_required)
    proposal = context.proposal_digest
    if needs_approval:
        approval = state.approvals.get(proposal) if proposal else None
        if approval is None or now >= approval.expires_at:
            msg = f"the run's policy needs an approval of the proposal this {tool_contract} effect commits"
            raise errors.ApprovalMissing(msg + ("" if proposal else ": name it in context.proposal_digest"))
        if policy.approvals == "epoch" and approval.epoch != state.epoch:
            msg = f"approval {approval.approval_id!r} was granted at epoch {approval.epoch}; the policy binds it there"
            raise errors.ApprovalMissing(msg)
    if needs_evidence:
        evidence = state.evidence.get(proposal) if proposal else None
        if evidence is None or evidence.verdict != "pass":
            msg = (
                f"the run's policy needs passing verifier evidence of the proposal this {tool_contract} effect commits"
            )
            raise errors.EvidenceMissing(msg + ("" if proposal else ": name it in context.proposal_digest"))


def gate(state: RunState, worker: str, epoch: int, op_id: str, now: int) -> GateDecision:
    """May ``worker`` at ``epoch`` perform operation ``op_id`` now? Yes only for the current epoch's
    live lease, an intent already recorded and not yet settled, and authority still valid."""
    refused = _lease_refusal(state, worker, epoch, now)
    if refused is not None:
        return refused
    op = state.operations.get(op_id)
    if op is None:
        known = state.op_ids is not None and intended(state, op_id)
        reason = "already_observed" if known else "unknown_operation"
        return GateDecision(False, reason, f"operation {op_id!r} has no open intent: record the intent first")
    if op.epoch != epoch:
        return GateDecision(False, "reconciliation_required", f"operation {op_id!r} was intended at epoch {op.epoch}")
    if op.authorization:
        live = state.grants.get(op.authorization)
        if live is None or (live.expires_at is not None and now >= live.expires_at):
            return GateDecision(False, "authority_missing", f"grant {op.authorization!r} is no longer live")
    return GateDecision(True, "allowed", f"{worker!r} may perform {op_id!r} at epoch {epoch}")


def gate_key(state: RunState, worker: str, epoch: int, key: str, now: int) -> GateDecision:
    """``gate`` asked by the idempotency key the external system sees rather than by op id: the open
    intent holding ``key`` is gated as ``gate`` does; a key whose intent already has an outcome is
    ``already_observed``; a key no intent holds (never used, or given back by a reconciliation that
    found the effect not applied or abandoned it) is ``unknown_operation``."""
    if not key:
        return GateDecision(False, "malformed", "an idempotency key cannot be empty")
    held = next((op for op in state.operations.values() if op.idempotency_key == key), None)
    if held is not None:
        return gate(state, worker, epoch, held.op_id, now)
    refused = _lease_refusal(state, worker, epoch, now)
    if refused is not None:
        return refused
    if state.used_keys is not None and key_used(state, key):
        detail = f"idempotency key {key!r} was used by an intent that already has an outcome: do not perform it again"
        return GateDecision(False, "already_observed", detail)
    return GateDecision(
        False, "unknown_operation", f"no open intent holds idempotency key {key!r}: record the intent first"
    )


def _lease_refusal(state: RunState, worker: str, epoch: int, now: int) -> GateDecision | None:
    """The gate's answer when ``worker`` at ``epoch`` does not hold the live lease (else ``None``)."""
    if not state.opened:
        return GateDecision(False, "run_not_found", f"no run {state.run_id!r} in this store")
    lease = state.lease
    if lease is None or (lease.worker, lease.epoch) != (worker, epoch):
        held = (
            f"held by {state.holder!r} at epoch {state.epoch}" if state.holder else f"no holder at epoch {state.epoch}"
        )
        detail = f"{worker!r} at epoch {epoch} does not hold the lease ({held})"
        return GateDecision(False, "stale_epoch", detail)
    if now >= lease.expires_at:
        return GateDecision(False, "lease_expired", f"lease epoch {epoch} expired at {utc_text(lease.expires_at)}")
    return None
