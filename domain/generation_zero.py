"""Generation zero: the payloads a handoff's events reference, stored by the ledger in their append.

A handoff document carries the migrated task state inline, but the log holds only digests. If the
destination's worker died right after the import, its replacement could not rebuild the run from
the destination's log: the state would live only in a document somewhere else. So the ledger
stores, in the blob store and in the same transaction as the events that reference them:

* with ``HandoffAccepted`` (in-store acceptance or import): the migrated state's canonical bytes
  (``state_bytes``) under ``state_ref.digest``, which is ``state_digest_of(state)``;
* with ``HandoffPrepared``: the document's bytes exactly as submitted under ``document_digest``,
  so the source's log holds exactly what it handed over, the migrated state included.

Blobs are keyed by the digest their event already names, a domain-separated SHA-256 of the bytes:
content addresses that an event needs no new field to point at, and that never collide with the
plain SHA-256 keys of other blobs. Pure: the ledger writes what ``blobs_of`` returns and checks what
it reads with ``migrated_state``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from baton.domain.commands import AcceptHandoff, Command, PrepareHandoff
from baton.domain.errors import BatonError, NoncanonicalDocument
from baton.domain.events import Event, HandoffAccepted, HandoffPrepared
from baton.domain.handoff_document import decode_document, document_digest, state_bytes, state_digest_of

__all__ = ["StateNotStored", "blobs_of", "handed_over", "migrated_state"]


class StateNotStored(BatonError):
    """The blob store does not hold the migrated state (or document) a handoff event references, or
    holds other bytes under its digest."""

    reason = "state_not_stored"


def blobs_of(command: Command, bodies: Sequence[Event]) -> dict[str, bytes]:
    """The blobs ``bodies`` (decided for ``command``) reference, keyed by digest: what the append stores.

    Empty for every other command, so an ordinary append is unchanged.
    """
    found: dict[str, bytes] = {}
    for body in bodies:
        if isinstance(body, HandoffAccepted) and isinstance(command, AcceptHandoff):
            # decided from this very document, so its state is the one ``state_ref`` binds
            found[body.state_ref.digest] = state_bytes(decode_document(command.document.encode()).state)
        elif isinstance(body, HandoffPrepared) and isinstance(command, PrepareHandoff):
            found[body.document_digest] = command.document.encode()
    return found


def migrated_state(data: bytes | None, accepted: HandoffAccepted) -> dict[str, Any]:
    """The state ``accepted`` continues from, read back from ``data`` (the blob under its digest).

    Checked before it is believed: the bytes must be a state's canonical bytes and their
    ``state_digest_of`` the digest the event binds; otherwise ``StateNotStored`` says why.
    """
    digest = accepted.state_ref.digest
    if data is None:
        if accepted.migration_id is msgspec.UNSET:
            msg = f"handoff {accepted.document_digest} was accepted before Baton stored the migrated state"
        else:
            msg = f"the blob store has no migrated state {digest}: the store lost a blob it committed"
        raise StateNotStored(msg)
    try:
        state = msgspec.json.decode(data)
        if isinstance(state, dict) and state_bytes(state) == data and state_digest_of(state) == digest:
            return state
    except (msgspec.DecodeError, NoncanonicalDocument):
        pass  # no state at all: as wrong as another state
    raise StateNotStored(f"the blob stored under {digest} is not the migrated state it names")


def handed_over(data: bytes | None, prepared: HandoffPrepared) -> bytes:
    """The document ``prepared`` bound, read back from ``data`` (the blob under its digest), checked."""
    digest = prepared.document_digest
    if data is None:
        msg = f"the blob store has no document {digest}: prepared before Baton stored it, or a blob was lost"
        raise StateNotStored(msg)
    if document_digest(data) != digest:
        raise StateNotStored(f"the blob stored under {digest} is not the document it names")
    return data
