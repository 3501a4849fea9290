"""What a handoff left in a store's blob store, read back and checked: generation zero's state.

The ledger stores the migrated state with the ``HandoffAccepted`` that continues from it, and the
document with the ``HandoffPrepared`` that binds it, in the same transaction
(``domain.generation_zero``). A worker replacing a destination that died right after the import
reads the state here, from this store alone: no document, no source store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baton.adapters.eventstore import RunLedger
from baton.domain import errors, generation_zero
from baton.domain.events import HandoffAccepted, HandoffPrepared, RecordedEvent

__all__ = ["AcceptedState", "accepted_state", "handed_over"]


@dataclass(frozen=True)
class AcceptedState:
    """The migrated state the run's latest accepted handoff continues from, as stored and checked."""

    run_id: str
    position: int  # of the HandoffAccepted
    document_digest: str
    state_digest: str
    data: bytes  # the state's canonical bytes, exactly as accepted
    state: dict[str, Any]
    event: HandoffAccepted


def accepted_state(ledger: RunLedger, run_id: str) -> AcceptedState:
    """The run's migrated state as its latest acceptance in this store took it on.

    ``NoHandoff`` when the run has none here, ``StateNotStored`` when the blob is missing or is
    not the state the event binds (never believed unchecked).
    """
    found = _latest(ledger, run_id, HandoffAccepted)
    body: HandoffAccepted = found.body  # type: ignore[assignment]  # what _latest looked for
    digest = body.state_ref.digest
    data = ledger.blobs([digest]).get(digest)
    state = generation_zero.migrated_state(data, body)
    assert data is not None  # migrated_state refuses a missing blob
    return AcceptedState(run_id, found.position, body.document_digest, digest, data, state, body)


def handed_over(ledger: RunLedger, run_id: str) -> bytes:
    """The document of the run's latest prepared handoff, as the source submitted it (checked)."""
    body: HandoffPrepared = _latest(ledger, run_id, HandoffPrepared).body  # type: ignore[assignment]
    return generation_zero.handed_over(ledger.blobs([body.document_digest]).get(body.document_digest), body)


def _latest(ledger: RunLedger, run_id: str, kind: type[HandoffAccepted | HandoffPrepared]) -> RecordedEvent:
    latest = None
    for event in ledger.history(run_id):
        if isinstance(event.body, kind):
            latest = event
    if latest is not None:
        return latest
    if ledger.state(run_id).version == 0:
        raise errors.RunNotFound(f"run {run_id!r} does not exist in this store")
    if kind is HandoffAccepted:
        raise errors.NoHandoff(f"run {run_id!r} has no accepted handoff in this store: no state was migrated into it")
    raise errors.NoHandoff(f"run {run_id!r} has no prepared handoff in this store: it was never handed off from here")
