"""Handoff through a ledger: build the document from the log, prepare, accept or import, read status.

The domain decides (``domain.handoff``) and verifies the document itself; this module only reads
the log to build the document and turns each step into one submission whose id is derived from the
document's digest. A retry after a lost acknowledgement is therefore the same submission and gets
the original verdict, and ``status`` answers "did it happen?" by reading the store, never by
assuming.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from baton.adapters.eventstore import RunLedger
from baton.adapters.eventstore.claims import sign_receipt
from baton.adapters.identity import SigningKey
from baton.domain import authority, errors
from baton.domain.authority import GateDecision
from baton.domain.commands import (
    AbortHandoff,
    AcceptHandoff,
    ClaimHandoff,
    ConfirmHandoff,
    PrepareHandoff,
    Submission,
    Verdict,
)
from baton.domain.events import HandoffClaimed, Placement
from baton.domain.handoff_document import (
    HandoffDocument,
    decode_document,
    document_digest,
    encode_document,
    state_digest_of,
)
from baton.domain.migrations import REGISTRY, MigrationRegistry
from baton.domain.receipts import ClaimReceipt

__all__ = [
    "HandoffStatus",
    "PreparedHandoff",
    "abort",
    "accept",
    "build_document",
    "claim",
    "confirm",
    "gate",
    "gate_key",
    "prepare",
    "status",
    "submit_prepare",
]


@dataclass(frozen=True)
class PreparedHandoff:
    document: bytes
    digest: str
    verdict: Verdict


@dataclass(frozen=True)
class HandoffStatus:
    """What the store says about a run's handoffs: the only source of truth after a lost reply."""

    run_id: str
    exists: bool
    pending: str | None
    accepted: str | None
    epoch: int
    holder: str | None
    position: int
    claimed_for: str | None = None  # the store the pending handoff was claimed for: the run lives there
    confirmed_at: int | None = None  # where that store says it imported the run
    said: str = ""  # the above in one sentence


def build_document(
    ledger: RunLedger,
    run_id: str,
    *,
    destination: Placement,
    state: dict[str, Any],
    to_version: int | None = None,
    to_store: str | None = None,
    registry: MigrationRegistry = REGISTRY,
) -> bytes:
    """The canonical document handing ``run_id`` to ``destination``, from the log as it is now.

    ``state`` is the task state the last checkpoint sealed (its digest must match: the meaning of
    the run may not change on the way); the migration to ``to_version`` runs here, once, and its
    result travels in the document, so no resume ever runs it again. ``to_store``: the id of the
    store the run moves to (``baton store id``), for a handoff across stores.
    """
    fold = ledger.resume_fold(run_id)
    run = fold.run
    if not run.opened:
        raise errors.RunNotFound(f"run {run_id!r} does not exist")
    if run.lease is None:
        raise errors.NoLease(f"run {run_id!r} has no lease holder to hand it off")
    checkpoint = fold.snapshot()
    if state_digest_of(state) != checkpoint.task_state_digest:
        msg = (
            f"the state given has digest {state_digest_of(state)}, but the run's checkpoint sealed "
            f"{checkpoint.task_state_digest}: hand off exactly the sealed state"
        )
        raise errors.HandoffDigestMismatch(msg)
    target = run.schema_version if to_version is None else to_version
    migrated, migration = registry.migrate(state, run.schema_name, run.schema_version, target)
    source = checkpoint.placement or run.lease.placement
    document = HandoffDocument(
        run_id=run_id,
        checkpoint=checkpoint,
        state_schema_name=migration.to_schema,
        state_schema_version=migration.to_version,
        state=migrated,
        state_digest=state_digest_of(migrated),
        usage=run.usage,
        ceilings=run.ceilings,
        migration=migration,
        predecessor_digest=run.handoff_digest,
        source=source,
        destination=destination,
        source_epoch=run.epoch,
        source_worker=run.lease.worker,
        destination_worker=destination.worker,
        destination_store=to_store if to_store is not None else msgspec.UNSET,
    )
    return encode_document(document)


def prepare(
    ledger: RunLedger,
    run_id: str,
    *,
    destination: Placement,
    state: dict[str, Any],
    to_version: int | None = None,
    to_store: str | None = None,
    ttl_ms: int = 30_000,
    key: SigningKey | None = None,
) -> PreparedHandoff:
    """Build the document and submit it as the current holder: the lease moves in the same append.

    ``key`` (here and below): the submitter's, in a store that verifies identities."""
    data = build_document(
        ledger, run_id, destination=destination, state=state, to_version=to_version, to_store=to_store
    )
    return submit_prepare(ledger, data, ttl_ms=ttl_ms, key=key)


def submit_prepare(
    ledger: RunLedger, document: bytes, *, ttl_ms: int = 30_000, key: SigningKey | None = None
) -> PreparedHandoff:
    """Submit a built document; repeating it after a lost reply is the same submission (a duplicate)."""
    digest = document_digest(document)
    doc = decode_document(document)
    command = PrepareHandoff(document.decode(), ttl_ms)
    submission = Submission(f"handoff-prepare:{digest}", doc.run_id, doc.source_worker, command, doc.source_epoch)
    return PreparedHandoff(document, digest, ledger.submit(_signed(submission, key)))


def accept(
    ledger: RunLedger,
    document: bytes,
    expected_digest: str,
    *,
    ttl_ms: int = 30_000,
    key: SigningKey | None = None,
    receipt: str = "",
    trust: str = "",
) -> Verdict:
    """The destination's acceptance (in this store) or import (into a store without the run, with
    the source's claim ``receipt`` and the source store's public key the caller ``trust``s).

    The bytes are not parsed before their digest is the expected one: untrusted input gets a
    verdict (``digest_mismatch``), never a parser's error. The domain then verifies the document;
    the submission id is derived from the digest, so repeating an import or an acceptance is
    idempotent.
    """
    if document_digest(document) != expected_digest:
        message = f"the document's digest is {document_digest(document)}, not the expected {expected_digest}"
        return _refused(errors.HandoffDigestMismatch(message))
    try:
        doc = decode_document(document)
    except errors.Rejection as rejection:
        return _refused(rejection)
    run = ledger.state(doc.run_id)
    epoch = run.epoch if run.opened else doc.source_epoch + 1
    command = AcceptHandoff(document.decode(), expected_digest, ttl_ms, receipt, trust)
    submission = Submission(f"handoff-accept:{expected_digest}", doc.run_id, doc.destination_worker, command, epoch)
    return ledger.submit(_signed(submission, key))


def abort(ledger: RunLedger, run_id: str, worker: str, reason: str, *, key: SigningKey | None = None) -> Verdict:
    """Call off a prepared handoff as the current lease holder."""
    run = ledger.state(run_id)
    submission_id = f"handoff-abort:{run.pending_handoff or 'none'}:{worker}"
    return ledger.submit(_signed(Submission(submission_id, run_id, worker, AbortHandoff(reason), run.epoch), key))


def claim(
    ledger: RunLedger, run_id: str, digest: str, for_store: str, *, key: SigningKey | None = None
) -> ClaimReceipt | Verdict:
    """In the source store: claim the prepared handoff ``digest`` for ``for_store`` and return the
    receipt signed by this store's key, or the refusal. The claim is recorded once; asked again for
    the same store (a lost reply), the same receipt comes back (Ed25519 signs deterministically)."""
    run = ledger.state(run_id)
    if run.claimed_store is None:
        worker = run.holder or ""  # the destination worker: the prepare gave it the lease
        command = ClaimHandoff(digest, for_store)
        verdict = ledger.submit(_signed(Submission(f"handoff-claim:{digest}", run_id, worker, command, run.epoch), key))
        if verdict.verdict == "rejected":
            return verdict
        run = ledger.state(run_id)
    if (run.claimed_store, run.pending_handoff) != (for_store, digest):
        msg = f"handoff {run.pending_handoff} of run {run_id!r} was claimed for store {run.claimed_store}"
        return _refused(errors.AlreadyClaimed(msg), run_id)
    position = next(e.position for e in ledger.history(run_id) if isinstance(e.body, HandoffClaimed))
    unsigned = ClaimReceipt(
        run_id=run_id, document_digest=digest, for_store=for_store, source_store="", position=position
    )
    return sign_receipt(ledger.identity(), unsigned)


def confirm(ledger: RunLedger, run_id: str, digest: str, position: int, *, key: SigningKey | None = None) -> Verdict:
    """In the source store: the destination says it imported the claimed handoff at ``position``."""
    run = ledger.state(run_id)
    command = ConfirmHandoff(digest, position)
    submission = Submission(f"handoff-confirm:{digest}", run_id, run.last_holder or "", command, run.epoch)
    return ledger.submit(_signed(submission, key))


def _refused(rejection: errors.Rejection, run_id: str | None = None) -> Verdict:
    """A refusal decided before anything was submitted, as the ledger would word it."""
    return Verdict(None, "rejected", run_id, reason=rejection.reason, message=rejection.message)


def _signed(submission: Submission, key: SigningKey | None) -> Submission:
    return key.sign(submission) if key is not None else submission


def gate(ledger: RunLedger, run_id: str, worker: str, epoch: int, op_id: str) -> GateDecision:
    """The mutation gateway: may ``worker`` at ``epoch`` perform ``op_id`` now (by the store's clock)?"""
    return authority.gate(ledger.state(run_id), worker, epoch, op_id, ledger.clock.now())


def gate_key(ledger: RunLedger, run_id: str, worker: str, epoch: int, key: str) -> GateDecision:
    """The mutation gateway asked by idempotency key: may ``worker`` at ``epoch`` perform the
    operation whose intent gave the external system ``key``?"""
    return authority.gate_key(ledger.state(run_id), worker, epoch, key, ledger.clock.now())


def status(ledger: RunLedger, run_id: str) -> HandoffStatus:
    run = ledger.state(run_id)
    return HandoffStatus(
        run_id,
        run.opened,
        run.pending_handoff,
        run.handoff_digest,
        run.epoch,
        run.holder,
        run.version,
        run.claimed_store,
        run.confirmed_position,
        _said(run.pending_handoff, run.handoff_digest, run.claimed_store, run.confirmed_position),
    )


def _said(pending: str | None, accepted: str | None, claimed: str | None, confirmed: int | None) -> str:
    if claimed is not None and confirmed is not None:
        return f"handed off to {claimed} at digest {pending} (imported there at position {confirmed})"
    if claimed is not None:
        return f"claimed for {claimed} at digest {pending}; its import is not confirmed here yet"
    if pending is not None:
        return f"handoff {pending} prepared, not yet accepted or claimed"
    return f"continues from handoff {accepted}" if accepted is not None else "no handoff"
