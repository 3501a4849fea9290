"""The rules of a run's operations: an intent is recorded before its effect, and each is settled once,
by an observation at the intent's epoch or by a reconciliation with evidence after a takeover.

An intent quotes the digest of its context; an observation must quote the same digest, so it
provably answers exactly that intent. Every operation is charged to the run's budget.
"""

from __future__ import annotations

from typing import Any

from baton.domain import errors
from baton.domain.budgets import Usage
from baton.domain.canonical import canonical_bytes, digest_of
from baton.domain.commands import ReconcileIntent, RecordIntent, RecordObservation
from baton.domain.events import BlobRef, IntentContext, IntentReconciled, IntentRecorded, ObservationRecorded
from baton.domain.state import OpRecord, RunState, intended, key_used

__all__ = [
    "CONTEXT_PREFIX",
    "MAX_INLINE_BYTES",
    "charged",
    "context_digest",
    "intent",
    "observation",
    "reconcile",
    "require_settled",
]

MAX_INLINE_BYTES = 64 * 1024
CONTEXT_PREFIX = b"baton.intent-context.v1\x00"


def context_digest(context: IntentContext) -> str:
    """The digest an observation must quote to prove it answers exactly this intent."""
    return digest_of(CONTEXT_PREFIX, canonical_bytes(context))


def charged(state: RunState, charge: Usage) -> Usage:
    """``charge``, once the run's ceilings allow its usage plus it (else ``BudgetExceeded``)."""
    state.ceilings.check(state.usage.plus(charge))
    return charge


def intent(state: RunState, command: RecordIntent) -> IntentRecorded:
    if intended(state, command.op_id):
        raise errors.DuplicateOperation(f"operation {command.op_id!r} already has an intent")
    if not command.idempotency_key:
        raise errors.Malformed("an intent needs the idempotency key the external system will see")
    if key_used(state, command.idempotency_key):
        msg = f"idempotency key {command.idempotency_key!r} is used by an earlier intent of this run"
        raise errors.IdempotencyKeyReused(msg)
    context = command.context
    arguments = _inline_text(context.arguments, "arguments")
    charge = charged(state, Usage(calls=1, argument_bytes=len(arguments)))
    return IntentRecorded(
        command.op_id,
        command.kind,
        command.tool_contract,
        context,
        context_digest(context),
        command.idempotency_key,
        charge,
    )


def observation(state: RunState, command: RecordObservation) -> ObservationRecorded:
    op = _open_operation(state, command.op_id)
    if op.epoch != state.epoch:
        msg = f"operation {command.op_id!r} was intended at epoch {op.epoch}; reconcile it instead"
        raise errors.ReconciliationRequired(msg)
    if command.context_digest != op.context_digest:
        msg = f"observation quotes {command.context_digest}, intent recorded {op.context_digest}"
        raise errors.ContextMismatch(msg)
    if (command.outcome == "failed") != (command.failure_reason is not None):
        raise errors.Malformed("failure_reason is required exactly when outcome is 'failed'")
    charge = _outcome_charge(state, command.result, command.result_ref, command.usage)
    return ObservationRecorded(
        command.op_id,
        command.context_digest,
        command.outcome,
        charge,
        command.failure_reason,
        command.result,
        command.result_ref,
        command.evidence_refs,
    )


def reconcile(state: RunState, by: str, command: ReconcileIntent) -> IntentReconciled:
    """``by`` (the submitting principal) settles an uncertain intent, on the evidence it names."""
    _open_operation(state, command.op_id)
    if not command.evidence:
        raise errors.Malformed("reconciliation needs evidence")
    charge = _outcome_charge(state, command.result, command.result_ref, command.usage)
    return IntentReconciled(
        command.op_id, command.resolution, command.evidence, charge, command.result, command.result_ref, by
    )


def require_settled(state: RunState, action: str) -> None:
    """No intent is uncertain, as sealing a checkpoint and completing the run need."""
    if state.operations:
        msg = f"cannot {action} with uncertain intents: {sorted(state.operations)}"
        raise errors.UncertainIntent(msg)


def _inline_text(value: Any, what: str) -> bytes:
    """The payload's canonical text as stored inside an event (ints as numbers, no newline)."""
    try:
        text = canonical_bytes(value, opaque=True)[:-1]
    except (TypeError, ValueError) as exc:
        raise errors.Malformed(f"{what}: {exc}") from None
    if len(text) > MAX_INLINE_BYTES:
        msg = f"{what} is {len(text)} bytes inline; the limit is {MAX_INLINE_BYTES}: store it as a blob"
        raise errors.PayloadTooLarge(msg)
    return text


def _outcome_charge(state: RunState, result: Any, result_ref: BlobRef | None, reported: Usage) -> Usage:
    """What settling an operation costs, for observations and reconciliations alike.

    The worker may report fuel, cost and result bytes; result bytes are never less than what the
    event itself carries (inline bytes plus the blob's size).
    """
    reported.validate()
    if reported.calls or reported.argument_bytes or reported.iterations or reported.stages:
        raise errors.Malformed("an outcome may report only fuel, cost_micros and result_bytes")
    inline = len(_inline_text(result, "result")) if result is not None else 0
    carried = inline + (result_ref.size if result_ref is not None else 0)
    result_bytes = max(carried, reported.result_bytes)
    return charged(state, Usage(result_bytes=result_bytes, fuel=reported.fuel, cost_micros=reported.cost_micros))


def _open_operation(state: RunState, op_id: str) -> OpRecord:
    op = state.operations.get(op_id)
    if op is not None:
        return op
    if intended(state, op_id):
        raise errors.AlreadyObserved(f"operation {op_id!r} already has a recorded outcome")
    raise errors.UnknownOperation(f"no intent recorded for operation {op_id!r}")
