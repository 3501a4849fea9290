"""The one canonical byte encoding that digests are computed over.

Sorted keys, compact separators, UTF-8, one trailing newline, and every integer of the schema
(counters, sizes, positions, epochs, times) written as a decimal string, so a consumer in any
language reproduces the bytes without 64-bit precision loss. Keys sort by Unicode code point (as
Python, Go and Rust compare strings; schema keys are ASCII, where every order agrees). Opaque
payloads (the values under ``OPAQUE_KEYS``: tool arguments and results) keep JSON numbers, because
there the type is data: ``1`` and ``"1"`` must not hash alike. Floats are refused everywhere: they
have no single decimal spelling.

The definition is ``canonical_value`` over msgspec's builtins of a value, written by one encoder
with sorted keys. Digests are forever, so these bytes never change:
``tests/unit/domain/test_canonical_vectors.py`` pins them with known answers.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

__all__ = [
    "OPAQUE_KEYS",
    "ZERO_DIGEST",
    "canonical_bytes",
    "canonical_value",
    "digest_of",
    "schema_integer",
    "short",
]

OPAQUE_KEYS = frozenset({"arguments", "result"})

ZERO_DIGEST = "sha256:" + "0" * 64

_encoder = msgspec.json.Encoder(order="sorted")


def canonical_value(value: Any, *, opaque: bool = False) -> Any:  # noqa: PLR0911 - one flat dispatch by type
    """Turn builtins into their canonical shape: schema ints to decimal strings, no floats.

    Containers must be exactly ``dict``, ``list`` or ``tuple`` (what ``msgspec.to_builtins`` gives);
    subclasses of ``str`` and ``int`` (string and integer enums) are written as their plain values.
    The exact builtin types are looked at first because nearly every value is one of them.
    """
    kind = type(value)
    if kind is str or value is None or kind is bool:
        return value
    if kind is int:
        return value if opaque else str(value)
    if kind is dict:
        return {_key(k): canonical_value(v, opaque=opaque or k in OPAQUE_KEYS) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [canonical_value(v, opaque=opaque) for v in value]
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value) if opaque else str(int(value))
    if isinstance(value, float):
        msg = "floats have no canonical form; use integers (e.g. micro-units) or strings"
        raise ValueError(msg)
    msg = f"cannot encode {type(value).__name__} canonically"
    raise TypeError(msg)


def _key(key: Any) -> str:
    if not isinstance(key, str):
        msg = f"object keys must be strings, not {type(key).__name__}"
        raise TypeError(msg)
    return key


def canonical_bytes(value: Any, *, opaque: bool = False) -> bytes:
    """Encode a Struct or builtins value canonically (see module docstring).

    ``opaque=True`` encodes a payload on its own (ints stay numbers), as it is inside an event.
    Sets are written sorted, so their bytes do not depend on a process's hash seed.
    """
    plain = msgspec.to_builtins(value, order="deterministic")
    return _encoder.encode(canonical_value(plain, opaque=opaque)) + b"\n"


def digest_of(prefix: bytes, data: bytes) -> str:
    """SHA-256 with a domain-separation prefix, so a digest of one kind never verifies another."""
    return "sha256:" + hashlib.sha256(prefix + data).hexdigest()


def schema_integer(value: object) -> int:
    """A schema integer read generically from stored bytes: its canonical decimal string, or (in
    stores written before the stored form) a JSON number. Any other spelling raises ValueError:
    ``int()`` alone would take ``"+1"``, ``" 1"``, ``"0_1"`` or ``True``."""
    if type(value) is int:
        return value
    if type(value) is str and value.isascii() and value.lstrip("-").isdigit() and value == str(int(value)):
        return int(value)
    raise ValueError(f"not a canonical integer: {value!r}")


def short(digest: str) -> str:
    """The first 12 hex digits: enough for a human to match lines of a timeline."""
    return digest.removeprefix("sha256:")[:12]
