"""One error tree for Baton.

Every rejection carries a stable ``reason`` code: the bus, the CLI and the verdict lines map errors
to replies and exit codes by that code, never by message text, so messages may improve freely.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AlreadyObserved",
    "BatonError",
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
    "Rejection",
    "RunAlreadyExists",
    "RunClosed",
    "RunNotFound",
    "StaleEpoch",
    "StoreUnavailable",
    "SubmissionConflict",
    "UncertainIntent",
    "UnknownOperation",
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
