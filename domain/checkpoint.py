"""The portable checkpoint: what a run *is* at a position, as references with digests.

It lives in the domain (not in the projection that computes it) because handoff documents carry
it and the domain validates them.
"""

from __future__ import annotations

import msgspec

from baton.domain.budgets import Ceilings, Usage
from baton.domain.events import BlobRef, Placement

__all__ = ["PortableState"]


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
