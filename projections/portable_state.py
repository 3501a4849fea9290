"""The portable run state: a checkpoint of references, rebuilt from the log at any position.

Everything a resuming worker needs is here as a reference with a digest (task state, observation
manifest, operation ledger, budget ledger, placement), never as process memory. The checkpoint
hash covers the whole document, so two folds agree exactly when their hashes do.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from domain.budgets import Ceilings, Usage
from domain.canonical import canonical_bytes, digest_of
from domain.events import (
    BlobRef,
    CheckpointSealed,
    Placement,
    RecordedEvent,
    RunOpened,
    TransitionRecorded,
)
from domain.state import RunState, apply

__all__ = ["PortableState", "PortableStateFold", "portable_state"]

_CHECKPOINT_PREFIX = b"baton.checkpoint.v1\x00"
_MANIFEST_PREFIX = b"baton.observation-manifest.v1\x00"
_LEDGER_PREFIX = b"baton.operation-ledger.v1\x00"
_BUDGET_PREFIX = b"baton.budget-ledger.v1\x00"
_AUTHORITY_PREFIX = b"baton.authority-context.v1\x00"


class PortableState(msgspec.Struct, frozen=True):
    run_id: str
    position: int
    checkpoint_id: str
    release_id: str
    state_schema_name: str
    state_schema_version: int
    stage: str
    status: str
    task_state_ref: BlobRef | None
    task_state_digest: str
    observation_manifest_ref: str
    operation_ledger_ref: str
    authority_context_ref: str
    budget_ledger_ref: str
    usage: Usage
    ceilings: Ceilings
    placement: Placement | None
    owner_epoch: int
    owner: str | None
    last_sealed_checkpoint: str | None
    head_digest: str
    workspace_snapshot_ref: BlobRef | None = None
    memory_snapshot_ref: BlobRef | None = None
    search_state_ref: BlobRef | None = None
    verifier_evidence_ref: BlobRef | None = None
    checkpoint_hash: str = ""


class PortableStateFold:
    """Incremental fold: ``apply`` events in position order, ``snapshot()`` at any point."""

    def __init__(self, run_id: str = "") -> None:
        self.run = RunState(run_id=run_id)
        self.task_ref: BlobRef | None = None
        self.task_digest = ""
        self.manifest = b""
        self.placement: Placement | None = None

    def apply(self, event: RecordedEvent) -> None:
        if not self.run.run_id:
            self.run.run_id = event.run_id
        apply(self.run, event)
        body = event.body
        if isinstance(body, RunOpened):
            self.task_ref, self.task_digest = body.task_ref, body.task_ref.digest
        elif isinstance(body, TransitionRecorded | CheckpointSealed):
            self.task_ref, self.task_digest = body.state_ref, body.state_digest
        if self.run.lease is not None:
            self.placement = self.run.lease.placement
        op_id = getattr(body, "op_id", None)
        if op_id is not None:
            # a running digest over (position, op, event digest): O(1) per event, order-sensitive
            self.manifest = digest_of(_MANIFEST_PREFIX, self.manifest + event.digest.encode()).encode()

    def snapshot(self) -> PortableState:
        run = self.run
        operations = sorted(
            (op.intent_position, op.op_id, op.status, op.outcome_position or 0) for op in run.operations.values()
        )
        draft = PortableState(
            run_id=run.run_id,
            position=run.version,
            checkpoint_id=f"{run.run_id}@{run.version}",
            release_id=run.release_id,
            state_schema_name=run.schema_name,
            state_schema_version=run.schema_version,
            stage=str(run.stage),
            status=run.status,
            task_state_ref=self.task_ref,
            task_state_digest=self.task_digest,
            observation_manifest_ref=self.manifest.decode() or digest_of(_MANIFEST_PREFIX, b""),
            operation_ledger_ref=digest_of(_LEDGER_PREFIX, canonical_bytes(operations)),
            authority_context_ref=digest_of(_AUTHORITY_PREFIX, canonical_bytes([run.epoch, run.holder])),
            budget_ledger_ref=digest_of(_BUDGET_PREFIX, canonical_bytes([run.usage, run.ceilings])),
            usage=run.usage,
            ceilings=run.ceilings,
            placement=self.placement,
            owner_epoch=run.epoch,
            owner=run.holder,
            last_sealed_checkpoint=run.last_checkpoint_id,
            head_digest=run.head_digest,
        )
        return msgspec.structs.replace(draft, checkpoint_hash=digest_of(_CHECKPOINT_PREFIX, canonical_bytes(draft)))


def portable_state(events: Iterable[RecordedEvent], run_id: str = "") -> PortableState:
    """The portable state after ``events`` (time travel: pass the first n events for position n)."""
    fold = PortableStateFold(run_id)
    for event in events:
        fold.apply(event)
    return fold.snapshot()
