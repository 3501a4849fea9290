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

import enum
import hashlib
import keyword
import re
from collections.abc import Callable
from typing import Any

import msgspec

__all__ = [
    "OPAQUE_KEYS",
    "ZERO_DIGEST",
    "canonical_bytes",
    "canonical_value",
    "digest_of",
    "is_plain_opaque",
    "schema_integer",
    "short",
    "struct_canonical_bytes",
]

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
        if not opaque and isinstance(value, msgspec.Struct):
            return _struct_bytes(value) + b"\n"
        plain = value if type(value) in _PLAIN else msgspec.to_builtins(value, order="deterministic")
        if opaque:
            _check_opaque(plain)
            return _encoder.encode(plain) + b"\n"
        return _encoder.encode(_schema(plain)) + b"\n"
    except Exception:  # whatever the fast path trips on, the reference decides
        return _reference_bytes(value, opaque=opaque)  # same bytes, or the reference path's exact error


def struct_canonical_bytes(value: msgspec.Struct, *, given: tuple[str, bytes] | None = None) -> bytes | None:
    """``canonical_bytes(value)`` without its newline, or None when only the reference path can say.

    For a caller with its own definition to fall back on (``seal`` has the whole envelope's).
    ``given`` is ``(field, text)``: the text of that field's value as it is written inside
    ``value`` (canonical, no newline), which the caller has just written from that very value and
    vouches for; it is spliced in instead of being written again (``decide`` hands an intent's
    context on to its event this way).
    """
    try:
        if given is None:
            return _struct_bytes(value)
        field, text = given
        key = (type(value), field)
        encode = _GIVEN_ENCODERS.get(key)
        if encode is None:
            encode = _GIVEN_ENCODERS[key] = _compile(type(value), given=field)
        return encode(value, text)
    except Exception:  # whatever the fast path trips on, the caller's definition decides
        return None


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


def is_plain_opaque(value: Any) -> bool:
    """Whether the sorted encoder writes this opaque payload as the reference does (exact builtins, string keys)."""
    try:
        _check_opaque(value)
    except _NotPlain:
        return False
    return True


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


# Structs (every event body and its parts) are encoded without building their builtins first: each
# Struct class gets a compiled encoder that fills its fields' texts into one template of its sorted
# ``"key":`` prefixes, writing strings and ints inline when they have exactly their declared type.
# JSON text is the concatenation of its members' texts, so the bytes are the reference's; anything
# unusual (a float, a subclass, a set, a Struct inside an opaque payload) raises ``_NotPlain``.

_strings = msgspec.json.Encoder()  # a string's JSON text: the same escaping as ``_encoder``


def _value_bytes(value: Any, opaque: bool) -> bytes:  # noqa: PLR0911 - one flat dispatch by type
    kind = type(value)
    if kind is str:
        return _strings.encode(value)
    if kind is int:
        return b"%d" % value if opaque else b'"%d"' % value
    if value is None:
        return b"null"
    if kind is bool:
        return b"true" if value else b"false"
    if kind is list or kind is tuple:
        return b"[" + b",".join([_value_bytes(item, opaque) for item in value]) + b"]"
    if kind is dict:
        if opaque:
            _check_opaque(value)
            return _encoder.encode(value)
        return _encoder.encode(_schema_dict(value))
    if not opaque and isinstance(value, msgspec.Struct):
        return _struct_bytes(value)
    if isinstance(value, enum.Enum) and type(value.value) is str:
        return _strings.encode(value.value)  # as ``to_builtins`` writes a string-valued enum
    raise _NotPlain


def _struct_bytes(value: msgspec.Struct) -> bytes:
    encode = _STRUCT_ENCODERS.get(type(value))
    if encode is None:
        encode = _STRUCT_ENCODERS[type(value)] = _compile(type(value))
    return encode(value)


_STRUCT_ENCODERS: dict[type, Callable[[Any], bytes]] = {}
_GIVEN_ENCODERS: dict[tuple[type, str], Callable[[Any, bytes], bytes]] = {}
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")


def _compile(cls: type, given: str | None = None) -> Callable[..., bytes]:
    """The encoder of one Struct class, or one that always defers to the reference path.

    With ``given``, the encoder takes that field's text as a second argument instead of writing it.
    A class of integers only (``Usage``) gets an encoder that remembers its texts (``_remembered``).
    """
    info = msgspec.inspect.type_info(cls)
    if not isinstance(info, msgspec.inspect.StructType) or not _compilable(cls, info):
        return _defer
    if given is not None and given not in {f.name for f in info.fields}:
        return _defer
    members: list[tuple[str, msgspec.inspect.Field | None]] = [(f.encode_name, f) for f in info.fields]
    if info.tag_field is not None:
        members.append((info.tag_field, None))
    # The text is joined from the literal texts between the values (``bytes %`` would parse a
    # template on every call: a third of the cost), written into the source as constants.
    literal, parts = b"{", []
    classes: dict[type, str] = {}
    for index, (key, field) in enumerate(sorted(members, key=lambda member: member[0])):
        literal += b'%b"%b":' % (b"," if index else b"", key.encode())
        if field is None:
            literal += _strings.encode(info.tag)
            continue
        parts += [repr(literal), "g" if field.name == given else _field_text(key, field, classes)]
        literal = b""
    parts.append(repr(literal + b"}"))
    parameters = "v" if given is None else "v, g"
    source = f"def encode({parameters}):\n    return b''.join(({', '.join(parts)},))\n"
    namespace: dict[str, Any] = {"S": _strings.encode, "V": _value_bytes, "B": _struct_bytes}
    namespace.update({name: cls for cls, name in classes.items()})
    exec(source, namespace)  # generated from the class's own field names, checked above
    encode: Callable[..., bytes] = namespace["encode"]
    if given is None and info.fields and all(isinstance(f.type, msgspec.inspect.IntType) for f in info.fields):
        return _remembered(encode, len(info.fields), frozen=_frozen(cls))
    return encode


def _field_text(key: str, field: msgspec.inspect.Field, classes: dict[type, str]) -> str:
    """The Python expression that writes one field's text (strings, ints and Structs of their declared type
    directly); ``classes`` collects the names the expression gives the Struct classes it mentions."""
    value = f"v.{field.name}"
    if key in OPAQUE_KEYS:
        return f"V({value}, True)"
    kind = field.type
    if isinstance(kind, msgspec.inspect.StrType) or (  # empty strings are common: optional fields
        isinstance(kind, msgspec.inspect.LiteralType) and all(type(choice) is str for choice in kind.values)
    ):
        return f"((S(x) if x else b'\"\"') if type(x := {value}) is str else V(x, False))"
    if isinstance(kind, msgspec.inspect.IntType):
        return f"(b'\"%d\"' % x if type(x := {value}) is int else V(x, False))"
    if isinstance(kind, msgspec.inspect.StructType):  # a charge, a placement: its encoder, without the dispatch
        name = classes.setdefault(kind.cls, f"C{len(classes)}")
        return f"(B(x) if type(x := {value}) is {name} else V(x, False))"
    return f"V({value}, False)"


_REMEMBERED_TEXTS = 4096  # per class; then it starts afresh (charges repeat, running totals do not)


def _frozen(cls: type) -> bool:
    config = getattr(cls, "__struct_config__", None)
    return bool(config is not None and config.frozen)


def _remembered(encode: Callable[[Any], bytes], size: int, *, frozen: bool) -> Callable[[Any], bytes]:
    """``encode`` for a class of ``size`` integer fields, remembering the texts of values made of exact ints.

    Keyed by the tuple of the fields: equal tuples of exact ints are the same value, so they have the
    same text. Anything else in a field (a bool, which equals an int; an enum; a float; ``Raw``) is
    written afresh every time, as the reference writes it or refuses it. The check is written out
    field by field: a generator over the fields cost as much as writing them. For a frozen class the
    last value remembered is also known by identity (``decide`` hands on one shared charge for
    intents of one size), which skips the tuple; the entry holds the value, so its id is not reused.
    Frozen is taken at its word: a value changed behind msgspec's back (``structs.force_setattr``)
    keeps its old text here, as it keeps its old sum in ``Usage.plus``.
    """
    exact = " and ".join(f"type(t[{i}]) is int" for i in range(size))
    by_identity = "    entry = last[0]\n    if entry[0] is v:\n        return entry[1]\n" if frozen else ""
    source = (
        "def remembered(v):\n"
        f"{by_identity}"
        "    t = astuple(v)\n"
        f"    if not ({exact}):\n"
        "        return encode(v)\n"
        "    text = texts.get(t)\n"
        "    if text is None:\n"
        "        text = encode(v)\n"
        "        if len(texts) >= limit:\n"
        "            texts.clear()\n"
        "        texts[t] = text\n"
        f"{'    last[0] = (v, text)' if frozen else ''}\n"
        "    return text\n"
    )
    texts: dict[tuple[Any, ...], bytes] = {}
    namespace: dict[str, Any] = {
        "astuple": msgspec.structs.astuple,
        "encode": encode,
        "texts": texts,
        "limit": _REMEMBERED_TEXTS,
        "last": [(None, b"")],  # one store of one tuple: a reader never sees half an entry
    }
    exec(source, namespace)  # generated from the number of fields only
    remembered: Callable[[Any], bytes] = namespace["remembered"]
    return remembered


def _compilable(cls: type, info: msgspec.inspect.StructType) -> bool:
    """Written as a plain object with a string tag, keys of lower-case letters, digits and ``_`` (they
    sort the same as their JSON texts), and attributes that read as ``v.<name>`` in Python source."""
    config = getattr(cls, "__struct_config__", None)
    if config is None or config.omit_defaults or info.array_like:
        return False
    if info.tag_field is not None and (type(info.tag) is not str or not _IDENTIFIER.fullmatch(info.tag_field)):
        return False
    return all(
        _IDENTIFIER.fullmatch(f.encode_name) and f.name.isidentifier() and not keyword.iskeyword(f.name)
        for f in info.fields
    )


def _defer(value: Any, *_: Any) -> bytes:
    raise _NotPlain


def digest_of(prefix: bytes, data: bytes, end: bytes = b"") -> str:
    """SHA-256 with a domain-separation prefix, so a digest of one kind never verifies another.

    The digest is of ``data + end``, without joining them (``seal_stored`` hashes an envelope's
    members and its closing brace this way, then stores the members with the digest instead).
    Each prefix is hashed once, and every digest continues from a copy of that state: cheaper than
    a new hash object (OpenSSL 3 looks the algorithm up for each), and the prefix is not copied.
    """
    started = _PREFIXED.get(prefix)
    if started is None:
        if len(_PREFIXED) >= _PREFIXES:  # a prefix that is not one of the constants: no state kept
            return "sha256:" + hashlib.sha256(prefix + data + end).hexdigest()
        started = _PREFIXED[prefix] = hashlib.sha256(prefix)  # never updated again: copies only
    hashed = started.copy()
    hashed.update(data)
    if end:
        hashed.update(end)
    return "sha256:" + hashed.hexdigest()


_PREFIXED: dict[bytes, Any] = {}  # the kinds of digest: module constants
_PREFIXES = 32  # a bound, so that a caller with prefixes made from data cannot grow it without end


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
