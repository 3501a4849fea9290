"""The handoff document: a run's continuation contract, as closed, canonical, digest-bound JSON.

**Canonical bytes** are ``domain.canonical``'s: sorted keys, compact, raw UTF-8, exactly one trailing
newline, every integer of the schema as a decimal string without sign or leading zero. The migrated
task ``state`` is an opaque payload: its integers stay JSON numbers (there ``1`` and ``"1"`` differ)
within the signed 64-bit range; floats have no canonical form anywhere. Every field is written, none
is optional on the wire. Decoding parses, re-encodes and requires byte equality, so unknown or
duplicate keys, ``"01"``, ``"+1"``, whitespace, a missing newline and truncation are all refused.

**Binding.** The checkpoint's ``task_state_digest`` names the *pre-migration* state in the blob store;
the document carries the *migrated* state inline and binds it with ``state_digest`` (see
``state_digest_of``), so a state altered without its digest is refused here. The redundant fields
(run id, usage, ceilings, epoch, schema versions, workers) must agree with the checkpoint and the
migration. Altering a field *and* everything bound to it yields a different, self-consistent
document: only ``document_digest``, compared with the digest received from a trusted channel
(``verify_document``), catches that. The document never vouches for itself.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Final, Literal

import msgspec

from baton.domain.budgets import COUNTERS, MAX_COUNTER, Ceilings, Usage
from baton.domain.canonical import canonical_value, digest_of
from baton.domain.checkpoint import PortableState
from baton.domain.credentials import MAX_DEPTH, find_credential
from baton.domain.errors import (
    CredentialInPayload,
    DocumentTooLarge,
    HandoffDigestMismatch,
    InconsistentDocument,
    Malformed,
    NoncanonicalDocument,
    PriorUsageExhaustsDestination,
)
from baton.domain.events import Placement

__all__ = [
    "IDENTITY",
    "MAX_DOCUMENT_BYTES",
    "MAX_STATE_DEPTH",
    "SCHEMA",
    "HandoffDocument",
    "Migration",
    "decode_document",
    "document_digest",
    "encode_document",
    "local_allowance",
    "state_bytes",
    "state_digest_of",
    "verify_document",
]

SCHEMA: Final = "baton.handoff.v1"
IDENTITY = "identity"
MAX_DOCUMENT_BYTES = 1 << 20
_STATE_PREFIX = b"baton.task-state.v1\x00"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_INT64 = (-(2**63), 2**63 - 1)
MAX_STATE_DEPTH = MAX_DEPTH - 1  # the state sits one level inside the document, which is screened whole


class Migration(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The state-schema change applied at handoff; ``migration_id`` is ``IDENTITY`` exactly when none."""

    from_schema: str
    from_version: int
    to_schema: str
    to_version: int
    migration_id: str

    @classmethod
    def identity(cls, schema: str, version: int) -> Migration:
        return cls(schema, version, schema, version, IDENTITY)


class HandoffDocument(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What the destination continues from (see the module docstring for what binds what)."""

    run_id: str
    checkpoint: PortableState
    state_schema_name: str
    state_schema_version: int
    state: dict[str, Any]
    state_digest: str
    usage: Usage
    ceilings: Ceilings
    migration: Migration
    predecessor_digest: str | None
    source: Placement
    destination: Placement
    source_epoch: int
    source_worker: str
    destination_worker: str
    # the store the run moves to (a cross-store handoff, which that store imports only with the
    # source's claim receipt); unset for a handoff within one store: then not on the wire at all
    destination_store: str | msgspec.UnsetType = msgspec.UNSET
    schema: Literal["baton.handoff.v1"] = SCHEMA


_encoder = msgspec.json.Encoder(order="sorted")


def state_bytes(state: dict[str, Any]) -> bytes:
    """The task state's canonical (opaque) bytes, with the trailing newline: what its digest covers."""
    return _json(_opaque(state))


def state_digest_of(state: dict[str, Any]) -> str:
    """The digest binding the migrated state: prefixed SHA-256 of its canonical (opaque) bytes."""
    return digest_of(_STATE_PREFIX, state_bytes(state))


def encode_document(doc: HandoffDocument) -> bytes:
    """The canonical bytes of a valid document; an invalid one raises the rejection decode would."""
    data = _canonical(doc)
    _validate(doc)
    return data


def decode_document(data: bytes) -> HandoffDocument:
    """Parse a document that is exactly canonical and valid (size bound checked before parsing)."""
    _check_size(data)
    try:
        # strict=False reads the schema's decimal strings as ints; re-encoding below pins their spelling
        doc = msgspec.json.decode(data, type=HandoffDocument, strict=False)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as error:
        raise NoncanonicalDocument(f"not a handoff document: {error}") from None
    except RecursionError:
        raise NoncanonicalDocument("not a handoff document: nested too deeply") from None
    canonical = _canonical(doc)
    if canonical != bytes(data):
        at = next((i for i, (a, b) in enumerate(zip(canonical, data, strict=False)) if a != b), None)
        at = min(len(canonical), len(data)) if at is None else at
        raise NoncanonicalDocument(f"handoff document bytes are not canonical (first difference at byte {at})")
    _validate(doc)
    return doc


def document_digest(data: bytes) -> str:
    """``sha256:`` + hex SHA-256 over ``baton.handoff.v1``, a zero byte, the 8-byte big-endian length, the bytes."""
    hashed = hashlib.sha256(SCHEMA.encode() + b"\x00" + len(data).to_bytes(8, "big"))  # a prefix per length
    hashed.update(data)
    return "sha256:" + hashed.hexdigest()


def verify_document(data: bytes, expected_digest: str) -> HandoffDocument:
    """Decode ``data`` only if its digest is ``expected_digest``, received from a trusted channel."""
    _check_size(data)
    if not _DIGEST.fullmatch(expected_digest):
        raise Malformed("expected digest must be 'sha256:' and 64 lowercase hex digits")
    actual = document_digest(data)
    if actual != expected_digest:
        raise HandoffDigestMismatch(f"handoff document digest {actual} is not the expected {expected_digest}")
    return decode_document(data)


def local_allowance(ceilings: Ceilings, carried: Usage) -> Ceilings:
    """What the destination may still spend: ``ceiling - carried`` per counter (``None`` stays unbounded).

    Refused with ``PriorUsageExhaustsDestination``, naming every such counter, when carried usage
    passes a ceiling, or reaches it after consuming some of it (``carried == ceiling > 0``). A ceiling
    of 0 that nothing has used is a limit the run always had, not one prior usage exhausted: its
    allowance is 0. The destination's reported usage is then ``carried.plus(local)``.
    """
    ceilings.validate()
    carried.validate()
    exhausted = []
    left: dict[str, int | None] = {}
    for name in COUNTERS:
        ceiling, used = getattr(ceilings, name), getattr(carried, name)
        if ceiling is not None and (used > ceiling or used == ceiling > 0):
            exhausted.append(f"{name} {used} of {ceiling}")
        left[name] = None if ceiling is None else ceiling - used
    if exhausted:
        raise PriorUsageExhaustsDestination("prior usage exhausts the destination: " + ", ".join(exhausted))
    return Ceilings(**left)


def _opaque(state: dict[str, Any]) -> Any:
    if _too_deep(state):
        raise NoncanonicalDocument(f"state is nested deeper than {MAX_STATE_DEPTH} levels")
    try:
        return canonical_value(state, opaque=True)
    except (TypeError, ValueError) as error:
        raise NoncanonicalDocument(f"state has no canonical form: {error}") from None


def _canonical(doc: HandoffDocument) -> bytes:
    fields = msgspec.structs.asdict(doc)
    state = fields.pop("state")
    if fields["destination_store"] is msgspec.UNSET:
        del fields["destination_store"]
    body = canonical_value(msgspec.to_builtins(fields, order="deterministic"))
    body["state"] = _opaque(state)
    return _json(body)


def _json(value: Any) -> bytes:
    try:
        return _encoder.encode(value) + b"\n"
    except UnicodeEncodeError:  # a lone surrogate: no UTF-8 spelling at all
        raise NoncanonicalDocument("a string of the document is not valid Unicode") from None


def _check_size(data: bytes) -> None:
    if len(data) > MAX_DOCUMENT_BYTES:
        msg = f"handoff document of {len(data)} bytes is over the {MAX_DOCUMENT_BYTES}-byte bound"
        raise DocumentTooLarge(msg)


def _validate(doc: HandoffDocument) -> None:
    """Range, binding and credential checks of a document (its canonical form is checked apart)."""
    if doc.schema != SCHEMA:
        raise NoncanonicalDocument(f"schema must be {SCHEMA!r}")
    for path, value in _ints(msgspec.to_builtins(msgspec.structs.replace(doc, state={})), "$"):
        if not 0 <= value <= MAX_COUNTER:
            raise NoncanonicalDocument(f"{path} must be a decimal string of 0 to {MAX_COUNTER}, got {value}")
    for path, value in _ints(doc.state, "$.state"):
        if not _INT64[0] <= value <= _INT64[1]:
            raise NoncanonicalDocument(f"{path} must be a signed 64-bit integer")
    for name, digest in [("state_digest", doc.state_digest), ("predecessor_digest", doc.predecessor_digest)]:
        if digest is not None and not _DIGEST.fullmatch(digest):
            raise InconsistentDocument(f"{name} must be 'sha256:' and 64 lowercase hex digits")
    point = doc.checkpoint
    mig = doc.migration
    checks = [
        (point.run_id == doc.run_id, "checkpoint.run_id differs from run_id"),
        (point.usage == doc.usage, "usage differs from checkpoint.usage"),
        (point.ceilings == doc.ceilings, "ceilings differ from checkpoint.ceilings"),
        (point.owner_epoch == doc.source_epoch, "source_epoch differs from checkpoint.owner_epoch"),
        (point.owner in (None, doc.source_worker), "source_worker differs from checkpoint.owner"),
        (point.placement in (None, doc.source), "source differs from checkpoint.placement"),
        (doc.source.worker == doc.source_worker, "source.worker differs from source_worker"),
        (doc.destination.worker == doc.destination_worker, "destination.worker differs from destination_worker"),
        (doc.destination_store is msgspec.UNSET or bool(doc.destination_store), "destination_store names no store"),
        (
            (mig.from_schema, mig.from_version) == (point.state_schema_name, point.state_schema_version),
            "migration.from differs from the checkpoint's state schema",
        ),
        (
            (mig.to_schema, mig.to_version) == (doc.state_schema_name, doc.state_schema_version),
            "migration.to differs from the state's schema",
        ),
        (
            ((mig.from_schema, mig.from_version) == (mig.to_schema, mig.to_version)) == (mig.migration_id == IDENTITY),
            f"migration_id must be {IDENTITY!r} exactly when the schema does not change",
        ),
        (doc.state_digest == state_digest_of(doc.state), "state_digest does not match the state"),
    ]
    failed = [message for ok, message in checks if not ok]
    if failed:
        raise InconsistentDocument("inconsistent handoff document: " + "; ".join(failed))
    found = find_credential(msgspec.to_builtins(doc))
    if found:
        raise CredentialInPayload(f"handoff document carries {found}")


def _ints(value: Any, path: str) -> list[tuple[str, int]]:
    """Every integer (not bool) in a builtins value, with its path; iterative, like the screen."""
    found, stack = [], [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, dict):
            stack.extend((f"{where}.{key}", child) for key, child in item.items())
        elif isinstance(item, list | tuple):
            stack.extend((f"{where}[{i}]", child) for i, child in enumerate(item))
        elif isinstance(item, int) and not isinstance(item, bool):
            found.append((where, item))
    return found


def _too_deep(value: Any) -> bool:
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            if depth >= MAX_STATE_DEPTH:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False
