"""One error tree for Baton.

Every rejection carries a stable ``reason`` code: the bus, the CLI and the verdict lines map errors
to replies and exit codes by that code, never by message text, so messages may improve freely.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AlreadyObserved",
    "BatonError",
    "BusUnavailable",
    "BudgetExceeded",
    "ChainBroken",
    "ConcurrencyConflict",
    "ContextMismatch",
    "CounterOverflow",
    "DuplicateOperation",
    "IllegalTransition",
    "LeaseExpired",
    "LeaseHeld",
    "Malformed",
    "NoLease",
    "PayloadTooLarge",
    "ReconciliationRequired",
    "ReplayDivergence",
    "ReplayIncomplete",
    "MigrationUnsafe",
    "Rejection",
    "RunAlreadyExists",
    "RunClosed",
    "RunNotFound",
    "StaleEpoch",
    "StoreUnavailable",
    "SubmissionConflict",
    "UncertainIntent",
    "UnknownOperation",
    # handoff documents, state migration and credential screening
    "CredentialInPayload",
    "DocumentTooLarge",
    "HandoffDigestMismatch",
    "InconsistentDocument",
    "MigrationMissing",
    "NoncanonicalDocument",
    "PriorUsageExhaustsDestination",
    "HandoffUnsafe",
    "HandoffPending",
    "NoHandoff",
    "SuccessorExists",
    "AuthorityMissing",
    "SelfAuthorization",
    "ApprovalMismatch",
    "ReverificationRequired",
    # identity (domain/identity.py)
    "SignatureRequired",
    "BadSignature",
    "UnknownPrincipal",
    "PrincipalRevoked",
    "PrincipalMismatch",
    "RoleNotAllowed",
    "SelfApproval",
    # run policy
    "ApprovalMissing",
    "EvidenceMissing",
    # run discipline
    "IdempotencyKeyReused",
    "ReplayRequired",
    "PrefixMismatch",
    # cross-store handoff
    "AlreadyClaimed",
    "ClaimRequired",
    "ClaimNotForThisStore",
]


class BatonError(Exception):
    """Root of every error Baton raises on purpose."""

    reason: ClassVar[str] = "error"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.reason)
        self.message = message or self.reason


class Rejection(BatonError):
    """A submission that breaks a rule of the domain; it stores nothing."""

    reason: ClassVar[str] = "rejected"


class Malformed(Rejection):
    reason = "malformed"


class RunNotFound(Rejection):
    reason = "run_not_found"


class RunAlreadyExists(Rejection):
    reason = "run_exists"


class RunClosed(Rejection):
    reason = "run_closed"


class StaleEpoch(Rejection):
    """The submitter does not hold the current lease; carries the epoch that does."""

    reason = "stale_epoch"

    def __init__(self, message: str, current_epoch: int) -> None:
        super().__init__(message)
        self.current_epoch = current_epoch


class LeaseHeld(Rejection):
    reason = "lease_held"


class NoLease(Rejection):
    reason = "no_lease"


class LeaseExpired(Rejection):
    reason = "lease_expired"


class IllegalTransition(Rejection):
    reason = "illegal_transition"


class BudgetExceeded(Rejection):
    reason = "budget_exceeded"


class CounterOverflow(Rejection):
    reason = "counter_overflow"


class DuplicateOperation(Rejection):
    reason = "duplicate_operation"


class UnknownOperation(Rejection):
    reason = "unknown_operation"


class AlreadyObserved(Rejection):
    reason = "already_observed"


class ContextMismatch(Rejection):
    reason = "context_mismatch"


class UncertainIntent(Rejection):
    """An effect whose outcome is unknown blocks new effects until it is reconciled."""

    reason = "uncertain_intent"


class ReconciliationRequired(Rejection):
    """An intent of an earlier epoch can only be settled by ``IntentReconciled``."""

    reason = "reconciliation_required"


class ReplayDivergence(Rejection):
    """A regenerated intent differs from the recorded one: the resume is not the same run."""

    reason = "replay_divergence"

    def __init__(self, message: str, position: int, fields: tuple[str, ...]) -> None:
        super().__init__(message)
        self.position = position
        self.fields = fields


class ReplayIncomplete(Rejection):
    """A new effect was attempted before the recorded prefix was consumed."""

    reason = "replay_incomplete"


class MigrationUnsafe(Rejection):
    """The resuming worker cannot honour the run: it lacks a tool contract or capability the run used."""

    reason = "migration_unsafe"


class PayloadTooLarge(Rejection):
    reason = "payload_too_large"


class SubmissionConflict(Rejection):
    """The same submission id arrived again with different content."""

    reason = "submission_conflict"


class ChainBroken(BatonError):
    """A stored event does not verify: altered bytes, a broken link or a gap."""

    reason = "digest_mismatch"

    def __init__(self, message: str, position: int) -> None:
        super().__init__(message)
        self.position = position


class ConcurrencyConflict(BatonError):
    """Another writer moved the run between read and append; reload and decide again."""

    reason = "concurrency_conflict"
    retryable = True


class StoreUnavailable(BatonError):
    reason = "store_unavailable"
    retryable = True


class BusUnavailable(BatonError):
    """The message bus cannot be reached: ``baton serve`` never says "ready" without one."""

    reason = "bus_unavailable"
    retryable = True


class NoncanonicalDocument(Rejection):
    """A handoff document whose bytes are not exactly its canonical encoding (or that has none)."""

    reason = "noncanonical_document"


class DocumentTooLarge(Rejection):
    """A handoff document past the size bound; refused before it is parsed."""

    reason = "document_too_large"


class HandoffDigestMismatch(Rejection):
    """A handoff document whose digest is not the one the trusted caller expects.

    Shares its reason code with ``ChainBroken``: both say "these bytes are not the bytes that were
    bound"; a verdict's ``rejected`` tells a refused input apart from a corrupt store.
    """

    reason = "digest_mismatch"


class InconsistentDocument(Rejection):
    """A canonical handoff document whose fields contradict each other (e.g. usage versus checkpoint)."""

    reason = "inconsistent_document"


class CredentialInPayload(Rejection):
    """A payload carries credential material; authority travels by reference only."""

    reason = "credential_in_payload"


class PriorUsageExhaustsDestination(Rejection):
    """The usage carried into a handoff already reaches a ceiling the destination must honour."""

    reason = "prior_usage_exhausts_destination"


class MigrationMissing(Rejection):
    """No chain of registered migrations leads from the state's schema version to the target's."""

    reason = "migration_missing"


class HandoffUnsafe(Rejection):
    """A handoff asked for where a move would lose meaning: uncertain effects, or no checkpoint sealed."""

    reason = "handoff_unsafe"


class HandoffPending(Rejection):
    """A handoff is prepared and not yet accepted: only its destination's acceptance (or an abort) may follow."""

    reason = "handoff_pending"


class NoHandoff(Rejection):
    """An acceptance or abort with no prepared handoff to act on."""

    reason = "no_handoff"


class SuccessorExists(Rejection):
    """One predecessor has at most one successor: this handoff was already accepted."""

    reason = "successor_exists"


class AuthorityMissing(Rejection):
    """An effect names authority the submitter does not hold at this epoch (grants never move)."""

    reason = "authority_missing"


class SelfAuthorization(Rejection):
    """The lease holder tried to grant itself authority or approve its own artifact."""

    reason = "self_authorization"


class ApprovalMismatch(Rejection):
    """The artifact about to be committed is not the one approved (an approval for P is not one for P')."""

    reason = "approval_mismatch"


class ReverificationRequired(Rejection):
    """The verifier evidence does not bind this artifact, workspace snapshot and environment: verify again."""

    reason = "reverification_required"


class SignatureRequired(Rejection):
    """The store verifies identities and the submission carries no signature."""

    reason = "signature_required"


class BadSignature(Rejection):
    """The signature does not verify with the key it names over the submission's signed bytes."""

    reason = "bad_signature"


class UnknownPrincipal(Rejection):
    """Neither the submission's principal nor the key it was signed with is in the registry."""

    reason = "unknown_principal"


class PrincipalRevoked(Rejection):
    """The principal was revoked: its earlier events stay valid, nothing new is accepted from it."""

    reason = "principal_revoked"


class PrincipalMismatch(Rejection):
    """The key that signed belongs to another principal than the one the submission names."""

    reason = "principal_mismatch"


class RoleNotAllowed(Rejection):
    """The principal's roles do not allow this command."""

    reason = "role_not_allowed"


class SelfApproval(Rejection):
    """An approval or verifier evidence from the lease holder (or a principal sharing its key)."""

    reason = "self_approval"


class ApprovalMissing(Rejection):
    """The run's policy needs an approval of exactly the proposal this effect commits, and none is live."""

    reason = "approval_missing"


class EvidenceMissing(Rejection):
    """The run's policy needs passing verifier evidence of exactly the proposal this effect commits."""

    reason = "evidence_missing"


class IdempotencyKeyReused(Rejection):
    """An intent names an idempotency key an earlier intent of the run used (and did not give back by
    being reconciled not applied or abandoned): the external system would see the same effect twice."""

    reason = "idempotency_key_reused"


class ReplayRequired(Rejection):
    """The lease passed to this worker: it must replay the run's prefix and say so (``resume_from``)
    before any new intent, transition, checkpoint, handoff or completion."""

    reason = "replay_required"


class PrefixMismatch(Rejection):
    """``resume_from`` names another position or digest than the prefix the ledger holds."""

    reason = "prefix_mismatch"


class AlreadyClaimed(Rejection):
    """The handoff was claimed for a store: the run continues there, and this store takes nothing
    more of it (no other claim, no abort, no acceptance, no work)."""

    reason = "already_claimed"


class ClaimRequired(Rejection):
    """An import needs the source's signed claim receipt for this document and store."""

    reason = "claim_required"


class ClaimNotForThisStore(Rejection):
    """The claim (or the document) names another store than the one asked to take the run."""

    reason = "claim_not_for_this_store"
