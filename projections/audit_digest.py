"""The canonical bytes of a *decoded* envelope, without the detour through builtins.

``domain.canonical.canonical_bytes`` is the definition: builtins of the envelope, every schema
integer as a decimal string, keys sorted, opaque payloads (``arguments``, ``result``) kept as they
are. The audit decodes every stored envelope into its typed form anyway (the rules need it), so
here each Struct type gets, once, a small generated function that copies a decoded value into a
*twin* Struct whose fields are the encoded names in sorted order (the body's ``type`` tag
included): integers become their decimal strings, nested Structs their twins, opaque payloads a
key-sorted copy. msgspec then writes the twin in field order, in C.

The result is only used where it equals the definition by construction: ``AuditFold.apply_stored``
takes this path for an envelope whose stored bytes are exactly msgspec's encoding of its typed
decode (so the typed value holds every stored field, nothing else, with exact types) and whose
digest then matches; anything else goes through the reference path. Whatever this module cannot
mirror exactly (a float, a subclass, a field type it does not know) raises ``Unsupported``, never
guesses. ``tests/unit/projections/test_audit_digest.py`` pins it to the reference byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from msgspec import inspect

from domain.canonical import OPAQUE_KEYS, canonical_value, digest_of
from domain.chain import EVENT_PREFIX
from domain.decide import CONTEXT_PREFIX, context_digest
from domain.events import IntentContext, RecordedEvent

__all__ = ["Unsupported", "canonical_struct_bytes", "quotes_context_digest", "recorded_digest"]


class Unsupported(Exception):
    """The value needs the reference encoder (``domain.canonical.canonical_bytes``)."""


_Convert = Callable[[Any], Any]
_twins: dict[tuple[type, tuple[str, ...]], _Convert] = {}
_by_type: dict[type, _Convert] = {}  # the twins without dropped fields, for a union's members
_encoder = msgspec.json.Encoder()  # field order: the twins' fields are already sorted
_sorted = msgspec.json.Encoder(order="sorted")  # the reference's encoder
_OPAQUE_LEAVES = frozenset({str, int, bool, type(None)})


def _opaque(value: Any) -> Any:
    """An opaque payload as the reference writes it: exact builtins, string keys, keys sorted."""
    kind = type(value)
    if kind is dict:
        out = {}
        for key in sorted(value):  # code point order, as the reference's encoder sorts
            if type(key) is not str:
                raise Unsupported
            item = value[key]
            out[key] = item if type(item) in _OPAQUE_LEAVES else _opaque(item)
        return out
    if kind is list or kind is tuple:
        return [item if type(item) in _OPAQUE_LEAVES else _opaque(item) for item in value]
    if kind in _OPAQUE_LEAVES:
        return value
    raise Unsupported


def _reference(value: Any) -> msgspec.Raw:
    """A field of a type this module does not mirror: the reference's own encoding of it."""
    return msgspec.Raw(_sorted.encode(canonical_value(msgspec.to_builtins(value, order="deterministic"))))


def _unsupported(value: Any) -> Any:
    raise Unsupported


def _int_or_none(value: int | None) -> str | None:
    return None if value is None else str(value)


def _twin_of(value: Any) -> Any:
    return _by_type[type(value)](value)


def _twin_or_none(value: Any) -> Any:
    return None if value is None else _by_type[type(value)](value)


def _verbatim(t: inspect.Type) -> bool:
    """Types whose decoded values the encoder writes exactly as the reference does."""
    if isinstance(t, inspect.StrType | inspect.BoolType | inspect.NoneType):
        return True
    if isinstance(t, inspect.LiteralType | inspect.EnumType):
        values = t.values if isinstance(t, inspect.LiteralType) else [m.value for m in t.cls]
        return all(type(v) is str for v in values) and (isinstance(t, inspect.LiteralType) or issubclass(t.cls, str))
    if isinstance(t, inspect.UnionType):
        return all(_verbatim(member) for member in t.types)
    if isinstance(t, inspect.VarTupleType | inspect.ListType):
        return _verbatim(t.item_type)
    return False


def _converter(name: str, t: inspect.Type) -> _Convert | None:
    """How a field becomes its canonical value (None: as it is)."""
    if name in OPAQUE_KEYS:
        return _opaque
    if _verbatim(t):
        return None
    members = t.types if isinstance(t, inspect.UnionType) else (t,)
    optional = any(isinstance(m, inspect.NoneType) for m in members)
    rest = [m for m in members if not isinstance(m, inspect.NoneType)]
    convert: _Convert = _reference
    if len(rest) == 1 and isinstance(rest[0], inspect.IntType):
        # a decoded int field holds an exact int (the decoder refuses a bool or a float there)
        convert = _int_or_none if optional else str
    elif rest and all(isinstance(m, inspect.StructType) for m in rest):
        compiled = [_compile(member.cls) for member in rest]  # type: ignore[attr-defined]
        convert = _twin_or_none if optional else _twin_of
        if len(rest) == 1 and not optional and compiled[0] is not _reference:
            convert = compiled[0]  # bound directly (not while it is being compiled: a recursive type)
    return convert


def _compile(cls: type, drop: tuple[str, ...] = ()) -> _Convert:
    key = (cls, drop)
    if key in _twins:
        return _twins[key]
    fallback = _unsupported if drop else _reference
    _twins[key] = fallback  # a recursive type is left to the reference
    config = cls.__struct_config__  # type: ignore[attr-defined]
    info = inspect.type_info(cls)
    if not isinstance(info, inspect.StructType) or config.omit_defaults or config.array_like:
        if not drop:
            _by_type[cls] = fallback
        return fallback
    exprs: dict[str, str] = {}
    namespace: dict[str, Any] = {}
    for index, field in enumerate(info.fields):
        if field.encode_name in drop:
            continue
        convert = _converter(field.name, field.type)
        exprs[field.encode_name] = f"value.{field.name}" if convert is None else f"f{index}(value.{field.name})"
        namespace[f"f{index}"] = convert
    if info.tag_field is not None:
        namespace["tag"] = str(info.tag)
        exprs[info.tag_field] = "tag"
    names = sorted(exprs)
    namespace["twin"] = msgspec.defstruct(f"Canonical{cls.__name__}", [(name, Any) for name in names])
    # One straight-line function per type: it runs for every event, several times.
    source = f"def convert(value):\n    return twin({', '.join(exprs[name] for name in names)})\n"
    exec(source, namespace)  # the source is built from this module's templates and the classes' field names
    _twins[key] = convert = namespace["convert"]
    if not drop:
        _by_type[cls] = convert
    return convert  # type: ignore[no-any-return]


def canonical_struct_bytes(value: msgspec.Struct, *, drop: tuple[str, ...] = ()) -> bytes:
    """``canonical_bytes(value)`` (without the fields in ``drop``) of a Struct *decoded by msgspec*
    (so an ``int`` field holds an exact int); ``Unsupported`` when that cannot be mirrored exactly."""
    try:
        return _encoder.encode(_compile(type(value), drop)(value)) + b"\n"
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a float or an odd value under _reference
        raise Unsupported from exc


def recorded_digest(event: RecordedEvent) -> str:
    """``domain.chain.envelope_digest`` of a decoded envelope, its ``digest`` field left out."""
    try:
        return digest_of(EVENT_PREFIX, _encoder.encode(_envelope(event)) + b"\n")
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise Unsupported from exc


def quotes_context_digest(context: IntentContext, quoted: str) -> bool:
    """Whether ``quoted`` is ``domain.decide.context_digest(context)``: this module's bytes first, and
    the domain's own function whenever they do not give ``quoted`` (so a mismatch is the domain's word)."""
    try:
        if digest_of(CONTEXT_PREFIX, canonical_struct_bytes(context)) == quoted:
            return True
    except Unsupported:
        pass
    try:
        return context_digest(context) == quoted
    except (TypeError, ValueError):  # a context with no canonical form (a float, say) has no digest to quote
        return False


_envelope = _compile(RecordedEvent, ("digest",))
