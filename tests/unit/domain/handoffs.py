"""A consistent handoff document and the source checkpoint it carries, for tests to vary field by field."""

from __future__ import annotations

from typing import Any

import msgspec

from baton.domain.budgets import Ceilings, Usage
from baton.domain.checkpoint import PortableState
from baton.domain.commands import AcceptHandoff
from baton.domain.events import Placement
from baton.domain.handoff_document import HandoffDocument, state_digest_of
from baton.domain.migrations import migrate
from baton.domain.receipts import ClaimReceipt

__all__ = [
    "CEILINGS",
    "DESTINATION",
    "DESTINATION_STORE",
    "PREDECESSOR",
    "SOURCE",
    "SOURCE_STORE",
    "USAGE",
    "V1_STATE",
    "checkpoint",
    "claimed_import",
    "document",
]

USAGE = Usage(calls=2, fuel=30, iterations=1, stages=3)
CEILINGS = Ceilings(calls=10, fuel=100)
SOURCE = Placement("w-a", model="m-1", region="eu")
DESTINATION = Placement("w-b", model="m-2", region="us", tool_contracts=("shell@1",))
PREDECESSOR = "sha256:" + "ab" * 32
V1_STATE: dict[str, Any] = {"goal": "fix", "candidates": [{"patch": "sha256:p", "verdict": "rejected"}]}


def checkpoint(**changes: Any) -> PortableState:
    """The source's sealed checkpoint at position 7 (short fake refs: only their spelling matters here)."""
    fields: dict[str, Any] = {
        "run_id": "run-kat",
        "position": 7,
        "checkpoint_id": "run-kat@7",
        "release_id": "rel-1",
        "state_schema_name": "coding-agent",
        "state_schema_version": 1,
        "stage": "CANDIDATE_READY",
        "status": "open",
        "task_state_ref": None,
        "task_state_digest": "sha256:t",
        "observation_manifest_ref": "sha256:o",
        "operation_ledger_ref": "sha256:l",
        "authority_context_ref": "sha256:a",
        "budget_ledger_ref": "sha256:b",
        "usage": USAGE,
        "ceilings": CEILINGS,
        "placement": SOURCE,
        "owner_epoch": 1,
        "owner": "w-a",
        "last_sealed_checkpoint": "run-kat@7",
        "head_digest": "sha256:h",
        "checkpoint_hash": "sha256:c",
    }
    return PortableState(**{**fields, **changes})


def document(**changes: Any) -> HandoffDocument:
    """A consistent document migrating coding-agent v1 -> v2 from w-a to w-b; ``changes`` override fields."""
    state, migration = migrate(V1_STATE, "coding-agent", 1, 2)
    fields: dict[str, Any] = {
        "run_id": "run-kat",
        "checkpoint": checkpoint(),
        "state_schema_name": "coding-agent",
        "state_schema_version": 2,
        "state": state,
        "state_digest": state_digest_of(state),
        "usage": USAGE,
        "ceilings": CEILINGS,
        "migration": migration,
        "predecessor_digest": PREDECESSOR,
        "source": SOURCE,
        "destination": DESTINATION,
        "source_epoch": 1,
        "source_worker": "w-a",
        "destination_worker": "w-b",
    }
    return HandoffDocument(**{**fields, **changes})


SOURCE_STORE, DESTINATION_STORE = "store-a", "store-b"


def claimed_import(data: bytes | str, digest: str, run_id: str, *, for_store: str = DESTINATION_STORE) -> AcceptHandoff:
    """The import of ``data`` with a claim receipt for ``for_store`` (the domain checks what a receipt
    binds; its signature is the ledger's to verify, so here it is a placeholder)."""
    receipt = ClaimReceipt(
        run_id=run_id, document_digest=digest, for_store=for_store, source_store=SOURCE_STORE, position=9,
        signature="checked-by-the-ledger",
    )  # fmt: skip
    text = data.decode() if isinstance(data, bytes) else data
    return AcceptHandoff(text, digest, receipt=msgspec.json.encode(receipt).decode())
