"""Resume snapshots as stored: the fold's bytes behind a tag that says this store wrote them, there.

A snapshot row is ``tag || PortableStateFold.to_bytes()`` under ``TOPIC``. The tag is HMAC-SHA256,
keyed by the store's snapshot key (``StoreIdentity.snapshot_key``), over the run id, the position,
the log's digest at that position and the fold's bytes: a row edited in the table, written without
the key, or copied from another run, position or fork of the log does not verify, and a resume
ignores it (``reads.LedgerReads.resume_fold``). A valid tag says only who wrote the row; what the
row says is checked by ``baton audit``, which compares every snapshot with the fold at its position.
"""

from __future__ import annotations

import hashlib
import hmac

from baton.domain.canonical import canonical_bytes

__all__ = ["TAG_BYTES", "TOPIC", "content", "seal", "unseal"]

# The frame (v1) around a ``projections.portable_state.ResumeState`` of shape v3. A change of shape
# that a resume must not decode old rows into changes this topic, with a migration that empties the
# snapshot table (as SQLite 2 and PostgreSQL 4 do): the audit reports rows in any other topic.
TOPIC = "baton.snapshot.v1:ResumeState.v3"
TAG_BYTES = 32
_TAG_PREFIX = b"baton.snapshot.v1\x00"


def seal(key: bytes, run_id: str, position: int, digest: str, data: bytes) -> bytes:
    """The stored bytes of the fold ``data`` of ``run_id`` at ``position``, whose event has ``digest``."""
    return _tag(key, run_id, position, digest, data) + data


def unseal(key: bytes, run_id: str, position: int, digest: str, stored: bytes) -> bytes | None:
    """The fold's bytes when ``stored`` carries this key's tag for exactly this run, position and digest."""
    tag, data = stored[:TAG_BYTES], stored[TAG_BYTES:]
    if len(tag) != TAG_BYTES or not hmac.compare_digest(tag, _tag(key, run_id, position, digest, data)):
        return None
    return data


def content(topic: str | None, stored: bytes) -> bytes:
    """What a row claims the fold was, tag unchecked (the audit compares it with the fold itself).

    A row in another shape is returned as it is: no fold encodes to it, so the audit reports it.
    """
    return stored[TAG_BYTES:] if topic == TOPIC else stored


def _tag(key: bytes, run_id: str, position: int, digest: str, data: bytes) -> bytes:
    mac = hmac.new(key, _TAG_PREFIX + canonical_bytes([run_id, position, digest]), hashlib.sha256)
    mac.update(data)
    return mac.digest()
