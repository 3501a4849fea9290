"""The handoff protocol's decisions: prepare at a sealed boundary, accept exactly the bound document.

A run moves as a checked continuation contract, never as a copied transcript:

1. the source, holding the lease, *prepares*: the document's digest is recorded and the lease moves
   to the destination at the next epoch in the same append, so the source is fenced from then on;
2. the destination *accepts* with the digest a trusted caller gave it, before any work of its own;
   against a store that has never seen the run, acceptance imports it (cross-store handoff);
3. one predecessor has at most one successor: a second acceptance is refused.

The document (``domain.handoff_document``) is verified here, in the domain, so no adapter has to be
trusted to have checked it.
"""

from __future__ import annotations

import msgspec

from baton.domain import errors
from baton.domain.commands import AbortHandoff, AcceptHandoff, ClaimHandoff, ConfirmHandoff, PrepareHandoff, Submission
from baton.domain.events import (
    BlobRef,
    Event,
    HandoffAborted,
    HandoffAccepted,
    HandoffClaimed,
    HandoffConfirmed,
    HandoffPrepared,
    LeaseGranted,
)
from baton.domain.handoff_document import (
    HandoffDocument,
    decode_document,
    document_digest,
    local_allowance,
    state_bytes,
    verify_document,
)
from baton.domain.receipts import decode_receipt
from baton.domain.stages import Stage
from baton.domain.state import RunState

__all__ = ["abort", "accept", "claim", "confirm", "prepare", "unsafe_reasons"]


def unsafe_reasons(state: RunState) -> list[str]:
    """Why the run cannot move now (empty when it can): the resumability reasons that block a move."""
    reasons = [
        f"operation {op.op_id!r} (position {op.intent_position}) has no recorded outcome: reconcile it first"
        for op in sorted(state.operations.values(), key=lambda op: op.intent_position)
    ]
    if state.sealed_position == 0:
        reasons.append("no checkpoint is sealed: seal one at a semantic boundary first")
    elif state.work_position > state.sealed_position:
        reasons.append(
            f"work at position {state.work_position} is after the last sealed checkpoint "
            f"(position {state.sealed_position}): seal a checkpoint first"
        )
    return reasons


def prepare(state: RunState, submission: Submission, command: PrepareHandoff, expires_at: int) -> list[Event]:
    """The source's half: the run must be at a sealed boundary and the document must be this run's now."""
    if state.pending_handoff is not None:
        raise errors.HandoffPending(f"handoff {state.pending_handoff} is prepared and not accepted yet")
    reasons = unsafe_reasons(state)
    if reasons:
        raise errors.HandoffUnsafe("the run cannot move now: " + "; ".join(reasons))
    data = command.document.encode()
    doc = decode_document(data)
    _require_bound(state, submission, doc)
    destination = doc.destination
    return [
        HandoffPrepared(
            document_digest(data),
            destination,
            doc.checkpoint.checkpoint_id,
            doc.migration.migration_id,
            doc.predecessor_digest,
            doc.destination_store,
        ),
        LeaseGranted(destination.worker, state.epoch + 1, destination, expires_at),
    ]


def claim(state: RunState, command: ClaimHandoff) -> list[Event]:
    """The destination claims, in the source, the prepared handoff for the store the document names."""
    if state.pending_handoff is None:
        raise errors.NoHandoff(f"no handoff is prepared for run {state.run_id!r}")
    if command.document_digest != state.pending_handoff:
        msg = f"the prepared handoff is {state.pending_handoff}, not {command.document_digest}"
        raise errors.HandoffDigestMismatch(msg)
    if state.pending_store != command.for_store:
        named = state.pending_store or "none (a handoff within this store)"
        raise errors.ClaimNotForThisStore(f"the document hands the run to store {named}, not {command.for_store}")
    return [HandoffClaimed(command.document_digest, command.for_store)]


def confirm(state: RunState, command: ConfirmHandoff) -> list[Event]:
    """The destination says, in the source, where it imported the claimed handoff."""
    if state.claimed_store is None or command.document_digest != state.pending_handoff:
        raise errors.NoHandoff(f"handoff {command.document_digest} of run {state.run_id!r} is not claimed here")
    if command.position < 1:
        raise errors.Malformed("position must be 1 or more")
    return [HandoffConfirmed(command.document_digest, state.claimed_store, command.position)]


def accept(state: RunState, submission: Submission, command: AcceptHandoff, expires_at: int) -> list[Event]:
    """The destination's half, in this store (after ``prepare``) or as an import into another store."""
    doc = verify_document(command.document.encode(), command.expected_digest)
    if submission.worker != doc.destination_worker:
        msg = f"the document hands the run to {doc.destination_worker!r}, not to {submission.worker!r}"
        raise errors.StaleEpoch(msg, current_epoch=state.epoch)
    if state.handoff_digest == command.expected_digest:
        raise errors.SuccessorExists(f"handoff {command.expected_digest} was already accepted")
    if not state.opened:
        _require_claimed(doc, command)
        return _import(doc, command, expires_at)
    if state.pending_handoff is None:
        if doc.predecessor_digest == state.handoff_digest and doc.run_id == state.run_id:
            msg = f"no handoff is prepared for run {state.run_id!r}: the source must prepare it first"
            raise errors.NoHandoff(msg)
        raise errors.SuccessorExists(f"run {state.run_id!r} already continues from another handoff")
    if doc.destination_store is not msgspec.UNSET:
        msg = f"the document hands the run to store {doc.destination_store}: import it there, with its claim"
        raise errors.ClaimNotForThisStore(msg)
    if state.pending_handoff != command.expected_digest:
        msg = f"the prepared handoff is {state.pending_handoff}, not {command.expected_digest}"
        raise errors.HandoffDigestMismatch(msg)
    return [_accepted(doc, command.expected_digest, imported=False)]


def _require_claimed(doc: HandoffDocument, command: AcceptHandoff) -> None:
    """An import needs the document to name its store and the source's receipt for exactly it (the
    receipt's signature and this store's id are checked by the ledger before deciding)."""
    if doc.destination_store is msgspec.UNSET:
        raise errors.ClaimRequired("the document names no destination store: export it with --to-store")
    if not command.receipt:
        raise errors.ClaimRequired("an import needs the source's claim receipt for this document")
    receipt = decode_receipt(command.receipt)
    if (receipt.run_id, receipt.document_digest) != (doc.run_id, command.expected_digest):
        raise errors.ClaimRequired("the claim receipt is for another document")
    if receipt.for_store != doc.destination_store:
        raise errors.ClaimNotForThisStore(f"the receipt claims the run for store {receipt.for_store}")


def abort(state: RunState, command: AbortHandoff) -> list[Event]:
    if state.pending_handoff is None:
        raise errors.NoHandoff(f"no handoff is prepared for run {state.run_id!r}")
    return [HandoffAborted(state.pending_handoff, command.reason)]


def _import(doc: HandoffDocument, command: AcceptHandoff, expires_at: int) -> list[Event]:
    local_allowance(doc.ceilings, doc.usage)  # refuses a destination the carried usage already exhausts
    destination = doc.destination
    return [
        _accepted(doc, command.expected_digest, imported=True),
        LeaseGranted(destination.worker, doc.source_epoch + 1, destination, expires_at),
    ]


def _accepted(doc: HandoffDocument, digest: str, *, imported: bool) -> HandoffAccepted:
    size = len(state_bytes(doc.state))
    return HandoffAccepted(
        document_digest=digest,
        source_epoch=doc.source_epoch,
        release_id=doc.checkpoint.release_id,
        schema_name=doc.state_schema_name,
        schema_version=doc.state_schema_version,
        state_ref=BlobRef(doc.state_digest, size, f"handoff:{digest}#state"),
        carried=doc.usage,
        ceilings=doc.ceilings,
        stage=Stage(doc.checkpoint.stage),
        imported=imported,
        predecessor_digest=doc.predecessor_digest,
        migration_id=doc.migration.migration_id,
        from_schema=doc.migration.from_schema,
        from_version=doc.migration.from_version,
    )


def _require_bound(state: RunState, submission: Submission, doc: HandoffDocument) -> None:
    """The document must describe this run exactly as the log has it now, from this source."""
    point = doc.checkpoint
    migration = doc.migration
    checks = [
        (doc.run_id == state.run_id, f"run_id {doc.run_id!r} is not {state.run_id!r}"),
        (doc.source_worker == submission.worker, f"source_worker {doc.source_worker!r} is not the submitter"),
        (doc.source_epoch == state.epoch, f"source_epoch {doc.source_epoch} is not the current epoch {state.epoch}"),
        (point.position == state.version, f"checkpoint.position {point.position} is not the head {state.version}"),
        (point.head_digest == state.head_digest, "checkpoint.head_digest is not the run's head digest"),
        (doc.usage == state.usage, "usage is not the run's usage"),
        (doc.ceilings == state.ceilings, "ceilings are not the run's ceilings"),
        (
            (migration.from_schema, migration.from_version) == (state.schema_name, state.schema_version),
            f"migration.from is not the run's state schema {state.schema_name} v{state.schema_version}",
        ),
        (
            doc.predecessor_digest == state.handoff_digest,
            f"predecessor_digest {doc.predecessor_digest} is not the run's last handoff {state.handoff_digest}",
        ),
        (doc.destination_worker != doc.source_worker, "a run cannot be handed to the worker that holds it"),
    ]
    failed = [message for ok, message in checks if not ok]
    if failed:
        raise errors.InconsistentDocument("the document does not describe this run now: " + "; ".join(failed))
