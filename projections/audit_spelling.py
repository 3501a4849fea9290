"""Whether an envelope's hashed bytes are exactly the canonical bytes of the event they decode to.

A digest that holds over stored bytes proves only that they are the bytes that were hashed. The
audit must also know that they are *the canonical bytes* of the event every reader decodes from
them; otherwise it would pass what ``domain.chain.verify_chain`` refuses (whitespace, unsorted or
duplicate keys, an escape the definition does not write, ``"epoch":1`` for ``"epoch":"1"``, a
float), a writer's encoder bug among them, or a lenient spelling (``"1e0"``, ``"-0"``, ``"null"``)
that decodes to a value whose canonical bytes differ. Re-encoding each event in Python would cost
more than the rest of the audit, so the check runs in msgspec's C code, in two steps:

* the bytes decode into a *twin* of the envelope, made once per event class: the same fields and
  tags, every schema integer a string, every nested Struct its twin, opaque payloads as they are
  (a float refused by a hook, as the definition refuses it), unknown fields refused. So every
  value has the type the definition writes, and every schema integer is quoted;
* the event's own encoding (keys sorted, compact, integers as numbers) then equals the bytes up to
  the quotes around those integers exactly when the bytes are canonical: a string read as ``n``
  that is not ``str(n)`` leaves other characters, and so does any other spelling.

A field type the twins do not mirror makes ``canonically_spelled`` answer False for every envelope,
which is always safe: the caller then verifies the reference way (``domain.chain.envelope_digest``).
``tests/unit/projections/test_audit_spelling.py`` pins it to the definition.
"""

from __future__ import annotations

import enum
import types
import typing
from typing import Any

import msgspec

from domain.events import EVENT_TYPES, RecordedEvent

__all__ = ["canonically_spelled"]

_DECIMAL = str  # a schema integer: a JSON string in the stored form
_KEPT = (str, bool, type(None))


class _Unmirrored(Exception):
    """A field type the twins do not mirror."""


_twins: dict[type, type] = {}


def _twin_type(annotation: Any) -> Any:  # noqa: PLR0911 - one case per kind of type
    if annotation is int:
        return _DECIMAL
    if annotation is Any or annotation in _KEPT:
        return annotation
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return annotation  # by value, as the definition writes it
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return _twin(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal and all(type(arg) is str for arg in args):
        return annotation
    if origin in (types.UnionType, typing.Union):
        return typing.Union[tuple(_twin_type(arg) for arg in args)]  # noqa: UP007 - built from a tuple
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return tuple[_twin_type(args[0]), ...]  # type: ignore[misc]
    if origin is dict and args and args[0] is str:
        return dict[str, _twin_type(args[1])]  # type: ignore[misc]
    raise _Unmirrored(annotation)


def _twin(cls: type[msgspec.Struct]) -> type:
    twin = _twins.get(cls)
    if twin is None:
        config = cls.__struct_config__
        fields = [(field.encode_name, _twin_type(field.type)) for field in msgspec.structs.fields(cls)]
        twin = msgspec.defstruct(
            f"Twin{cls.__name__}",
            fields,
            tag=config.tag,
            tag_field=config.tag_field,
            forbid_unknown_fields=True,
        )
        _twins[cls] = twin
    return twin


def _no_float(text: str) -> Any:
    raise ValueError(f"a float ({text}): the canonical definition refuses floats")


def _decoder() -> msgspec.json.Decoder[Any] | None:
    try:
        body: Any = typing.Union[tuple(_twin(cls) for cls in EVENT_TYPES.values())]  # noqa: UP007 - from a tuple
        fields = [
            (field.encode_name, body if field.name == "body" else _twin_type(field.type))
            for field in msgspec.structs.fields(RecordedEvent)
            if field.name != "digest"
        ]
        twin = msgspec.defstruct("TwinRecordedEvent", fields, forbid_unknown_fields=True)
        return msgspec.json.Decoder(twin, float_hook=_no_float)
    except (_Unmirrored, TypeError):
        return None


_twin_decoder = _decoder()
_sorted = msgspec.json.Encoder(order="sorted")
_string = msgspec.json.Encoder()


def canonically_spelled(hashed: bytes, event: RecordedEvent) -> bool:
    """Whether ``hashed`` (an envelope without its digest, newline included) is exactly the canonical
    bytes of ``event``, its lenient (``strict=False``) decode."""
    if _twin_decoder is None or hashed.find(b'"null"') >= 0:  # the one string a lenient decode reads as absent
        return False
    try:
        _twin_decoder.decode(hashed)
    except msgspec.DecodeError:  # a validation error too: a value of another type than the definition writes
        return False
    # Every value has the definition's type, and every schema integer is a string. The event's own
    # encoding (keys sorted, compact, integers as numbers) then equals the bytes up to the quotes
    # around those integers exactly when the bytes are canonical: a string that decoded to n but is
    # not ``str(n)`` (``"1.0"``, ``"1e0"``, ``"-0"``) leaves other characters, and so does any
    # other spelling (whitespace, key order, a duplicate key, an escape the definition does not write).
    encoded = _sorted.encode(event)
    member = b',"digest":' + _string.encode(event.digest)
    cut = encoded.rfind(member)  # the envelope's own: nothing after it can hold an unescaped quote
    if cut < 0:
        return False
    unquoted = (encoded[:cut] + encoded[cut + len(member) :]).translate(None, b'"') + b"\n"
    return unquoted == hashed.translate(None, b'"')
