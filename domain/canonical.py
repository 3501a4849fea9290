"""The one canonical byte encoding that digests are computed over.

Sorted keys, compact separators, UTF-8, one trailing newline, and every integer of the schema
(counters, sizes, positions, epochs, times) written as a decimal string, so a consumer in any
language reproduces the bytes without 64-bit precision loss. Keys sort by Unicode code point (as
Python, Go and Rust compare strings; schema keys are ASCII, where every order agrees). Opaque payloads (the
values under ``OPAQUE_KEYS``: tool arguments and results) keep JSON numbers, because there the
type is data: ``1`` and ``"1"`` must not hash alike. Floats are refused everywhere: they have no
single decimal spelling.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

__all__ = ["OPAQUE_KEYS", "ZERO_DIGEST", "canonical_bytes", "canonical_value", "digest_of", "short"]

OPAQUE_KEYS = frozenset({"arguments", "result"})

ZERO_DIGEST = "sha256:" + "0" * 64

_encoder = msgspec.json.Encoder(order="sorted")


def canonical_value(value: Any, *, opaque: bool = False) -> Any:
    """Turn builtins into their canonical shape: schema ints to decimal strings, no floats."""
    kind = type(value)  # exact-type dispatch first: this runs for every field of every event
    if kind is str or value is None or kind is bool:
        return value
    if kind is int:
        return value if opaque else str(value)
    if kind is dict:
        return {
            k if type(k) is str else _key(k): canonical_value(v, opaque=opaque or k in OPAQUE_KEYS)
            for k, v in value.items()
        }
    if kind is list or kind is tuple:
        return [canonical_value(v, opaque=opaque) for v in value]
    return _canonical_subclass(value, opaque=opaque)


def _canonical_subclass(value: Any, *, opaque: bool) -> Any:
    """The slow path: subclasses of the builtin types (enums, bools), and refusals."""
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
    try:
        plain = value if type(value) in _PLAIN else msgspec.to_builtins(value, order="deterministic")
        if opaque:
            _check_opaque(plain)
            return _encoder.encode(plain) + b"\n"
        return _encoder.encode(_schema(plain)) + b"\n"
    except (_NotPlain, TypeError, ValueError):
        return _reference_bytes(value, opaque=opaque)  # same bytes, or the reference path's exact error


def _reference_bytes(value: Any, *, opaque: bool) -> bytes:
    """The definition the fast path must match byte for byte: builtins, then ``canonical_value``."""
    return _encoder.encode(canonical_value(msgspec.to_builtins(value, order="deterministic"), opaque=opaque)) + b"\n"


# The fast path: it runs for every event (up to three times), so it walks only values of exact
# builtin types, in loops rather than one call per node, passes opaque payloads through after
# checking them, and leaves anything unusual (floats, subclasses, sets, Structs nested in builtins,
# non-string keys) to ``_reference_bytes`` by raising ``_NotPlain``.


class _NotPlain(Exception):
    """The value needs the reference path."""


_LEAVES = frozenset({str, bool, type(None)})
_PLAIN = frozenset({dict, list, tuple, str, int, bool, type(None)})


def _schema(value: Any) -> Any:
    """``canonical_value`` of a value made of exact builtin types, outside opaque payloads."""
    kind = type(value)
    if kind is dict:
        return _schema_dict(value)
    if kind is list or kind is tuple:
        return _schema_list(value)
    if kind is int:
        return str(value)
    if kind in _LEAVES:
        return value
    raise _NotPlain


def _schema_dict(value: dict[Any, Any]) -> dict[str, Any]:
    out = value.copy()  # then replace only what changes: most values are strings
    for key, item in value.items():
        if type(key) is not str:
            raise _NotPlain
        kind = type(item)
        if kind is str or item is None or kind is bool:
            continue
        if kind is int:
            if key not in OPAQUE_KEYS:
                out[key] = str(item)
        elif key in OPAQUE_KEYS:
            _check_opaque(item)
        elif kind is dict:
            out[key] = _schema_dict(item)
        elif kind is list or kind is tuple:
            out[key] = _schema_list(item)
        else:
            raise _NotPlain
    return out


def _schema_list(value: list[Any] | tuple[Any, ...]) -> list[Any]:
    out: list[Any] = []
    for item in value:
        kind = type(item)
        if kind in _LEAVES:
            out.append(item)
        elif kind is int:
            out.append(str(item))
        elif kind is dict:
            out.append(_schema_dict(item))
        elif kind is list or kind is tuple:
            out.append(_schema_list(item))
        else:
            raise _NotPlain
    return out


def _check_opaque(value: Any) -> None:
    """An opaque payload encodes as it is if it holds only exact builtins and string keys."""
    kind = type(value)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise _NotPlain
            if type(item) not in _OPAQUE_LEAVES:
                _check_opaque(item)
    elif kind is list or kind is tuple:
        for item in value:
            if type(item) not in _OPAQUE_LEAVES:
                _check_opaque(item)
    elif kind not in _OPAQUE_LEAVES:
        raise _NotPlain


_OPAQUE_LEAVES = frozenset({str, int, bool, type(None)})


def digest_of(prefix: bytes, data: bytes) -> str:
    """SHA-256 with a domain-separation prefix, so a digest of one kind never verifies another."""
    return "sha256:" + hashlib.sha256(prefix + data).hexdigest()


def short(digest: str) -> str:
    """The first 12 hex digits: enough for a human to match lines of a timeline."""
    return digest.removeprefix("sha256:")[:12]
