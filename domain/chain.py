"""The hash chain: how envelopes get their digests, and how a stored log is verified.

Verification reads the *stored bytes* generically (no event classes needed), so an auditor running
an older or newer release can still check a log, and upcasting never disturbs a digest.

The *stored form* of an envelope is its canonical bytes (what its digest covers) with the digest
added as the last member: ``{...canonical members...,"digest":"sha256:..."}``. It is still one JSON
object holding every field, and cutting the last member off gives back exactly the hashed bytes;
the writer encodes each event once, for its digest and its stored bytes alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from baton.domain.canonical import ZERO_DIGEST, canonical_bytes, digest_of, schema_integer
from baton.domain.commands import Submission
from baton.domain.errors import ChainBroken
from baton.domain.events import Event, RecordedEvent
from baton.domain.identity import signed_content, signed_digest

__all__ = [
    "EVENT_PREFIX",
    "ChainReport",
    "envelope_bytes",
    "envelope_digest",
    "seal",
    "seal_stored",
    "stored_bytes",
    "stored_form",
    "verify_chain",
]

EVENT_PREFIX = b"baton.event.v1\x00"


def envelope_digest(envelope_without_digest: dict[str, Any]) -> str:
    """The digest of an envelope given as builtins, with its ``digest`` key absent."""
    return digest_of(EVENT_PREFIX, canonical_bytes(envelope_without_digest))


def stored_form(canonical: bytes, digest: str) -> bytes:
    """The envelope as stored: its canonical bytes (ending ``}\\n``) with the digest as a last member."""
    return canonical[:-2] + b',"digest":' + msgspec.json.encode(digest) + b"}"


def envelope_bytes(event: RecordedEvent) -> bytes:
    """The bytes an envelope's digest covers, by the definition: the canonical bytes of every field but ``digest``."""
    builtins = msgspec.to_builtins(event, order="deterministic")  # sets sorted, as ``canonical_bytes`` writes them
    del builtins["digest"]
    return canonical_bytes(builtins)


def stored_bytes(event: RecordedEvent) -> bytes:
    """The stored form of a sealed envelope (``seal_stored`` gives the same bytes)."""
    return stored_form(envelope_bytes(event), event.digest)


def seal(
    run_id: str,
    head: int,
    head_digest: str,
    submission: Submission,
    epoch: int,
    bodies: Sequence[Event],
    now: int,
) -> list[RecordedEvent]:
    """Wrap bodies into envelopes at positions ``head+1..``, each chained to the one before."""
    return [event for event, _ in seal_stored(run_id, head, head_digest, submission, epoch, bodies, now)]


def seal_stored(
    run_id: str,
    head: int,
    head_digest: str,
    submission: Submission,
    epoch: int,
    bodies: Sequence[Event],
    now: int,
    *,
    signed: str | None = None,
) -> list[tuple[RecordedEvent, bytes]]:
    """``seal``, with each envelope's stored form: its canonical bytes, encoded once, give both its
    digest and the bytes the store keeps. ``signed`` is the submission's ``signed_digest`` when the
    caller has computed it already (verifying its signature); it is computed here otherwise."""
    worker, submission_id, signature = submission.worker, submission.submission_id, submission.signature
    if not signature:
        signed = ""
    elif signed is None:
        signed = signed_digest(submission)
    sealed: list[tuple[RecordedEvent, bytes]] = []
    prev = head_digest
    content = signed_content(submission) if signature else None
    for offset, body in enumerate(bodies, start=1):
        position = head + offset
        kept = content if offset == 1 else None
        unsealed = RecordedEvent(
            run_id, position, epoch, worker, submission_id, now, prev, body, "", signed, signature, kept
        )
        canonical = envelope_bytes(unsealed)
        digest = digest_of(EVENT_PREFIX, canonical)
        event = msgspec.structs.replace(unsealed, digest=digest)
        sealed.append((event, stored_form(canonical, digest)))
        prev = digest
    return sealed


class ChainReport(msgspec.Struct, frozen=True):
    events: int
    head_digest: str


def verify_chain(stored: Iterable[bytes], run_id: str | None = None) -> ChainReport:
    """Check positions 1..n are contiguous, each links to its predecessor and each digest holds.

    Raises ``ChainBroken`` naming the first position that fails.
    """
    prev = ZERO_DIGEST
    expected = 1
    for data in stored:
        try:
            envelope = msgspec.json.decode(data)
            if not isinstance(envelope, dict):
                raise TypeError("not an object")
            claimed = envelope.pop("digest")
            position = schema_integer(envelope["position"])  # a decimal string in the stored form
        except (msgspec.DecodeError, KeyError, TypeError, ValueError) as exc:
            raise ChainBroken(f"position {expected}: undecodable envelope ({exc})", expected) from None
        if position != expected:
            raise ChainBroken(f"position {expected}: found position {position} (gap or reorder)", expected)
        if run_id is not None and envelope.get("run_id") != run_id:
            raise ChainBroken(f"position {expected}: belongs to run {envelope.get('run_id')!r}", expected)
        if envelope.get("prev_digest") != prev:
            raise ChainBroken(f"position {expected}: prev_digest does not match position {expected - 1}", expected)
        try:
            actual = envelope_digest(envelope)
        except (TypeError, ValueError) as exc:
            raise ChainBroken(f"position {expected}: not canonically encodable ({exc})", expected) from None
        if actual != claimed:
            raise ChainBroken(f"position {expected}: digest mismatch (stored {claimed}, computed {actual})", expected)
        prev = claimed
        expected += 1
    return ChainReport(events=expected - 1, head_digest=prev)
