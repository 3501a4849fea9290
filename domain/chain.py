"""The hash chain: how envelopes get their digests, and how a stored log is verified.

Verification reads the *stored bytes* generically (no event classes needed), so an auditor running
an older or newer release can still check a log, and upcasting never disturbs a digest.

The *stored form* of an envelope is its canonical bytes (what its digest covers) with the digest
added as the last member: ``{...canonical members...,"digest":"sha256:..."}``. It is still one JSON
object holding every field, and cutting the last member off (``hashed_part``) gives back exactly
the hashed bytes, so a reader checks a digest over the stored bytes themselves, with no decoding
or re-encoding, and the writer encodes each event once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from baton.domain.canonical import ZERO_DIGEST, canonical_bytes, digest_of, schema_integer, struct_canonical_bytes
from baton.domain.commands import Submission
from baton.domain.errors import ChainBroken
from baton.domain.events import Event, RecordedEvent

__all__ = [
    "EVENT_PREFIX",
    "ChainReport",
    "envelope_bytes",
    "envelope_digest",
    "hashed_part",
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
    return _with_digest(canonical[:-2], digest)


def _with_digest(members: bytes, digest: str) -> bytes:
    """``{...members`` (unclosed) closed with the digest as its last member: the one shape of the stored form.

    Joined rather than formatted (``bytes %`` parses its template on every call: a third of the cost).
    """
    return b"".join((members, b',"digest":', _strings.encode(digest), b"}"))


_FIRST_MEMBER = b'{"body":'  # the smallest key: an older store's JSON starts with ``{"run_id":``
_DIGEST_MEMBER = b',"digest":"sha256:'
_DIGEST_TAIL = len(_DIGEST_MEMBER) + 64 + 2  # the member, 64 hex digits, the closing quote and brace


def hashed_part(stored: bytes) -> tuple[bytes, bytes] | None:
    """``(the bytes the digest covers, the claimed digest)`` of an envelope in the stored form, else None.

    None means only that the bytes are not in the stored form (an older store's, an export line,
    a tampered one): the caller verifies them the reference way (``envelope_digest``).
    """
    cut = len(stored) - _DIGEST_TAIL
    shaped = stored.startswith(_FIRST_MEMBER) and stored.startswith(_DIGEST_MEMBER, cut) and stored.endswith(b'"}')
    if cut < 2 or not shaped:
        return None
    return stored[:cut] + b"}\n", stored[cut + 11 : -2]


def envelope_bytes(event: RecordedEvent) -> bytes:
    """The bytes an envelope's digest covers, by the definition: the canonical bytes of every field but ``digest``."""
    builtins = msgspec.to_builtins(event, order="deterministic")  # sets sorted, as ``canonical_bytes`` writes them
    del builtins["digest"]
    return canonical_bytes(builtins)


def stored_bytes(event: RecordedEvent) -> bytes:
    """The stored form of a sealed envelope, by the definition (``seal_stored`` gives the same bytes)."""
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
    encoded: Sequence[bytes | None] = (),
) -> list[tuple[RecordedEvent, bytes]]:
    """``seal``, with each envelope's stored form (``stored_form``), encoded once for both.

    ``encoded`` holds the canonical bytes of the first bodies where ``decide`` wrote them already.
    """
    worker, submission_id = submission.worker, submission.submission_id
    # The envelope's canonical bytes are its sorted fields around the body's canonical bytes, so
    # only the body is walked; the fixed fields are spliced in when they have their exact types.
    spliced = type(head) is int and type(submission_id) is str
    template = _members_template(run_id, worker, epoch, now) if spliced else None
    sid = b"" if template is None else _strings.encode(submission_id)
    before_position, before_prev, before_sid, after_sid = template or (b"", b"", b"", b"")
    sealed: list[tuple[RecordedEvent, bytes]] = []
    prev = head_digest
    for offset, body in enumerate(bodies, start=1):
        position = head + offset
        if template is None or type(prev) is not str:
            body_bytes = None
        elif offset <= len(encoded) and encoded[offset - 1] is not None:
            body_bytes = encoded[offset - 1]
        else:
            body_bytes = struct_canonical_bytes(body)
        if body_bytes is not None and template is not None:
            # every member but the digest, unclosed: hashed with the canonical ending, stored with the digest's
            members = b"".join(
                (
                    _FIRST_MEMBER, body_bytes, before_position, b"%d" % position,
                    before_prev, _strings.encode(prev), before_sid, sid, after_sid,
                )
            )  # fmt: skip
            digest = digest_of(EVENT_PREFIX, members, _CANONICAL_END)
            stored = _with_digest(members, digest)
        else:
            canonical = envelope_bytes(RecordedEvent(run_id, position, epoch, worker, submission_id, now, prev, body))
            digest = digest_of(EVENT_PREFIX, canonical)
            stored = stored_form(canonical, digest)
        sealed.append((RecordedEvent(run_id, position, epoch, worker, submission_id, now, prev, body, digest), stored))
        prev = digest
    return sealed


def _members_template(run_id: object, worker: object, epoch: object, now: object) -> _Template | None:
    """The envelope's members but the digest, unclosed, as the texts between the body, position, previous
    digest and submission id (after ``_FIRST_MEMBER``), or None unless every field has its exact type.
    Joined with those, not formatted: ``bytes %`` parses its template on every call. A batch's events
    share run, worker, epoch and time: the last template is kept.
    """
    if not (type(run_id) is str and type(worker) is str and type(epoch) is int and type(now) is int):
        return None
    key = (run_id, worker, epoch, now)  # exact types, so equal keys write equal texts (True == 1 is excluded)
    last = _last_template[0]
    if last[0] == key:
        return last[1]
    template = (
        b',"epoch":"%d","position":"' % epoch,
        b'","prev_digest":',
        b',"recorded_at":"%d","run_id":%b,"submission_id":' % (now, _strings.encode(run_id)),
        b',"worker":' + _strings.encode(worker),
    )
    _last_template[0] = (key, template)  # one store of one tuple: a reader never sees half an entry
    return template


_Template = tuple[bytes, bytes, bytes, bytes]
_last_template: list[tuple[tuple[object, ...], _Template]] = [((), (b"", b"", b"", b""))]


_CANONICAL_END = b"}\n"


_strings = msgspec.json.Encoder()


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
