"""The canonical bytes of a *decoded* envelope, written straight from its fields.

``domain.canonical.canonical_bytes`` is the definition: builtins of the envelope, every schema
integer as a decimal string, keys sorted, opaque payloads (``arguments``, ``result``) kept as they
are. The audit decodes every stored envelope into its typed form anyway (the rules need it), so
here each Struct type gets, once, a small generated *writer*: one f-string holding its members in
sorted key order (the body's ``type`` tag included, as a constant; a nested Struct inline), filled
from its fields. A schema integer is written as its decimal digits between quotes, a string by
msgspec's own encoder (the reference's escaping), a nested union of Structs by its member's writer,
an opaque payload by the reference's sorted encoder once it holds only exact builtins. A whole
envelope is one f-string per body type; an intent's context is written once and serves both the
envelope's digest and the context digest the intent quotes.

*Plain* writers put strings between quotes as they are: that is msgspec's encoding of a string
exactly when the encoding holds no backslash (msgspec escapes only with one), so the caller may
pick them only for a value whose whole encoding has none (``AuditFold.apply_stored`` picks them
when the stored bytes it decoded hold no backslash: JSON without one can hold no string that needs
escaping). They also remember the text of a record of counters (``Usage``) by its value: charges
repeat.

``AuditFold.apply_stored`` takes this path for an envelope in the stored form and trusts it only
where it proves itself: it decodes the bytes with ``DECODER`` (which refuses floats, so a payload it
decodes needs no walk before the sorted encoder writes it), ``stored_writer`` writes the whole
stored form (the canonical bytes with the digest as a last member), which must equal the stored
bytes byte for byte (so they are the canonical bytes of the event every reader decodes from them,
plus its digest), and the digest must be that of the canonical bytes; anything else goes through
the reference path. Whatever this module cannot mirror
exactly (a float, a subclass, a field type it does not know) raises ``Unsupported``, or hands that
one field to the reference encoder; it never guesses.
``tests/unit/projections/test_audit_digest.py`` pins it to the reference byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from msgspec import inspect

from baton.domain.canonical import OPAQUE_KEYS, canonical_value, digest_of, is_plain_opaque
from baton.domain.chain import EVENT_PREFIX
from baton.domain.decide import CONTEXT_PREFIX
from baton.domain.events import IntentContext, IntentRecorded, RecordedEvent

__all__ = [
    "DECODER",
    "WRITE_ERRORS",
    "Unsupported",
    "canonical_struct_bytes",
    "recorded_canonical",
    "recorded_digest",
    "stored_writer",
]


class Unsupported(Exception):
    """The value needs the reference encoder (``domain.canonical.canonical_bytes``)."""


_plain = msgspec.json.Encoder().encode  # the JSON text of a string, bool, null or tuple: the reference's escaping
_sorted = msgspec.json.Encoder(order="sorted").encode  # the reference's encoder
_OPAQUE_LEAVES = frozenset({str, int, bool, type(None)})
_ERRORS = (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError, UnicodeError)
_INLINE_DEPTH = 4  # nested Structs deeper than this are written by a call to their own writer
_MEMO_SIZE = 4096  # remembered texts per record type (a bound on memory, not a tuning knob)


def _opaque(value: Any) -> str:
    if type(value) not in _OPAQUE_LEAVES and not is_plain_opaque(value):
        raise Unsupported  # a float above all: the reference refuses it
    return _sorted(value).decode()


def _decoded_opaque(value: Any) -> str:
    """An opaque payload decoded by ``DECODER``: JSON without floats is exact builtins with string keys."""
    return _sorted(value).decode()


def _no_float(literal: str) -> Any:
    raise Unsupported(f"a float ({literal}): the reference refuses it")


DECODER = msgspec.json.Decoder(RecordedEvent, strict=False, float_hook=_no_float)
"""The typed decode of stored envelopes that the *plain* writers take (``recorded_canonical``,
``stored_writer``): lenient, as the stored form writes schema integers as decimal strings, and
raising ``Unsupported`` for a float anywhere a payload is untyped (the only place one can decode as
a float), so an opaque payload it decodes holds exact builtins and string keys only: what
``domain.canonical.is_plain_opaque`` asks, without walking it again. (A float in an integer field
decodes leniently as an int, and is then written otherwise than it was stored.)"""


def _json(value: Any) -> str:
    return _plain(value).decode()


def _reference(value: Any) -> str:
    """A field of a type this module does not mirror: the reference's own encoding of it."""
    return _sorted(canonical_value(msgspec.to_builtins(value, order="deterministic"))).decode()


def _int_or_none(value: int | None) -> str:
    return "null" if value is None else f'"{value}"'


_Pieces = list[tuple[bool, str]]
"""A writer's text as pieces: ``(False, literal text)`` or ``(True, a Python expression giving text)``."""


class _Writers:
    """The generated writers of one mode (plain strings or escaped), by Struct type."""

    def __init__(self, plain: bool, *, decoded: bool = False) -> None:
        self.plain = plain  # strings between quotes as they are (see the module's docstring)
        self.decoded = decoded  # only for envelopes decoded by ``DECODER``: no opaque payload is re-checked
        self.whole: dict[type, Callable[[Any], str]] = {}
        self.compiling: set[type] = set()
        self.namespace: dict[str, Any] = {
            "_opaque": _decoded_opaque if decoded else _opaque,
            "_json": _json,
            "_reference": _reference,
            "_int_or_none": _int_or_none,
            "_BOOLS": ("false", "true"),
            "_Q": '"',
            "_sorted": _sorted,
            "_struct": self.struct,
            "_struct_or_none": self.struct_or_none,
            "_structs": self.structs,
        }

    def struct(self, value: Any) -> str:
        write = self.whole.get(type(value))
        return write(value) if write is not None else self.writer(type(value))(value)

    def struct_or_none(self, value: Any) -> str:
        return "null" if value is None else self.struct(value)

    def structs(self, value: Any) -> str:
        return "[" + ",".join([self.struct(item) for item in value]) + "]"

    def writer(self, cls: type) -> Callable[[Any], str]:
        """The writer of a whole Struct (``Unsupported`` for a type it cannot mirror)."""
        write = self.whole.get(cls)
        if write is None:
            pieces = self.members(cls, "value", depth=0)
            if pieces is None:
                raise Unsupported
            write = self.whole[cls] = self.function("value", pieces)
        return write

    def function(self, params: str, pieces: _Pieces, prelude: str = "", also: str = "") -> Any:
        """One straight-line function returning one f-string (the fastest way CPython joins text).

        ``also``: more values returned after it (then the function returns a tuple)."""
        source = f"def write({params}):\n{prelude}    return {self.expression(pieces)}{also}\n"
        namespace = dict(self.namespace)
        exec(source, namespace)  # built from this module's pieces and the classes' field names
        return namespace["write"]

    def expression(self, pieces: _Pieces) -> str:
        """The f-string of the pieces (literal text it cannot hold goes into the namespace as a constant)."""
        parts = []
        for is_expr, text in pieces:
            if is_expr:
                parts.append("{" + text + "}")
            elif all(" " <= char <= "~" and char not in "\\'" for char in text):
                parts.append(text.replace("{", "{{").replace("}", "}}"))
            else:  # text an f-string literal cannot hold as it is: a constant
                self.namespace[name := f"_text{len(self.namespace)}"] = text
                parts.append("{" + name + "}")
        return f"f'{''.join(parts)}'"

    def members(
        self, cls: type, ref: str, depth: int, drop: tuple[str, ...] = (), given: dict[str, _Pieces] | None = None
    ) -> _Pieces | None:
        """The pieces of the Struct at ``ref``, members in sorted key order; None when it cannot be mirrored."""
        config = getattr(cls, "__struct_config__", None)
        info = inspect.type_info(cls)
        if config is None or not isinstance(info, inspect.StructType) or config.omit_defaults or config.array_like:
            return None
        if info.tag_field is not None and type(info.tag) is not str:
            return None
        self.compiling.add(cls)
        try:
            slots: dict[str, _Pieces] = {}
            for field in info.fields:
                name = field.encode_name
                if name in drop:
                    continue
                if given and name in given:
                    slots[name] = given[name]
                else:
                    slots[name] = self.slot(name, field.type, f"{ref}.{field.name}", depth)
        finally:
            self.compiling.discard(cls)
        if info.tag_field is not None:
            slots[info.tag_field] = [(False, _json(info.tag))]
        pieces: _Pieces = []
        for index, name in enumerate(sorted(slots)):  # code point order, as the reference's encoder sorts
            pieces.append((False, ("{" if index == 0 else ",") + _json(name) + ":"))
            pieces.extend(slots[name])
        pieces.append((False, "}" if slots else "{}"))
        return pieces

    def remembered(self, cls: type, expr: str) -> str:
        """An expression for the text of a record of counters (``Usage``), remembered by value.

        Most events repeat a few charges. Equal values of such a Struct (same type, equal ints) have
        the same text, for values *decoded by msgspec* (exact ints: ``True == 1`` is no concern), which
        is why only the plain writers (the fold's) remember.
        """
        write = self.writer(cls)
        memo: dict[Any, str] = {}

        def remember(value: Any) -> str:
            if len(memo) >= _MEMO_SIZE:
                memo.clear()
            text = memo[value] = write(value)
            return text

        index = len(self.namespace)
        self.namespace[f"_memo{index}"], self.namespace[f"_remember{index}"] = memo, remember
        return f"_memo{index}.get({expr}) or _remember{index}({expr})"

    def scalar(self, t: inspect.Type, expr: str) -> _Pieces | None:
        """The pieces of an int, string, string enum or bool field (None for other types)."""
        if isinstance(t, inspect.IntType):
            # a decoded int field holds an exact int (the decoder refuses a bool or a float): str() is its digits
            return [(False, '"'), (True, expr), (False, '"')]
        if isinstance(t, inspect.EnumType) and _all_str([m.value for m in t.cls]):
            expr = f"{expr}.value"
        elif not (isinstance(t, inspect.StrType) or (isinstance(t, inspect.LiteralType) and _all_str(t.values))):
            return [(True, f"_BOOLS[{expr}]")] if isinstance(t, inspect.BoolType) else None
        return [(False, '"'), (True, expr), (False, '"')] if self.plain else [(True, f"_json({expr})")]

    def slot(self, key: str, t: inspect.Type, expr: str, depth: int) -> _Pieces:  # noqa: PLR0911
        """A field's pieces."""
        if key in OPAQUE_KEYS:
            return [(True, f"_sorted({expr}).decode()" if self.decoded else f"_opaque({expr})")]
        if (scalar := self.scalar(t, expr)) is not None:
            return scalar
        if self.decoded and (inline := self.inline(t, expr)) is not None:
            return [(True, inline)]
        if isinstance(t, inspect.StructType) and self.plain and _counters(t):
            return [(True, self.remembered(t.cls, expr))]
        if isinstance(t, inspect.StructType) and depth < _INLINE_DEPTH and t.cls not in self.compiling:
            pieces = self.members(t.cls, expr, depth + 1)
            return pieces if pieces is not None else [(True, f"_reference({expr})")]
        members = t.types if isinstance(t, inspect.UnionType) else (t,)
        rest = [m for m in members if not isinstance(m, inspect.NoneType)]
        if _verbatim(t):
            return [(True, f"_json({expr})")]
        if len(rest) == 1 and isinstance(rest[0], inspect.IntType):
            return [(True, f"_int_or_none({expr})")]
        if rest and all(isinstance(m, inspect.StructType) for m in rest):
            return [(True, f"_struct_or_none({expr})" if len(rest) < len(members) else f"_struct({expr})")]
        if isinstance(t, inspect.VarTupleType | inspect.ListType) and isinstance(t.item_type, inspect.StructType):
            return [(True, f"_structs({expr})")]
        return [(True, f"_reference({expr})")]

    def inline(self, t: inspect.Type, expr: str) -> str | None:
        """For a decoded envelope: an optional or empty field's usual value written without a call."""
        members = t.types if isinstance(t, inspect.UnionType) else (t,)
        rest = [m for m in members if not isinstance(m, inspect.NoneType)]
        if len(rest) == len(members) - 1 == 1:  # optional
            one = rest[0]
            if isinstance(one, inspect.IntType):
                return f'("null" if {expr} is None else _Q + str({expr}) + _Q)'
            if self.plain and (
                isinstance(one, inspect.StrType) or (isinstance(one, inspect.LiteralType) and _all_str(one.values))
            ):
                return f'("null" if {expr} is None else _Q + {expr} + _Q)'
            if isinstance(one, inspect.StructType):
                return f'("null" if {expr} is None else _struct({expr}))'
        if isinstance(t, inspect.VarTupleType | inspect.ListType) and _verbatim(t):
            return f'("[]" if not {expr} else _json({expr}))'  # decoded: a tuple or a list
        return None


def _all_str(values: Any) -> bool:
    return all(type(v) is str for v in values)


def _counters(t: inspect.StructType) -> bool:
    """A frozen (hashable) Struct of plain integers, such as ``Usage``."""
    config = t.cls.__struct_config__
    return (
        bool(t.fields)
        and config.frozen
        and t.tag_field is None
        and all(isinstance(f.type, inspect.IntType) for f in t.fields)
    )


def _verbatim(t: inspect.Type) -> bool:
    """Types whose decoded values msgspec's plain encoder writes exactly as the reference does."""
    if isinstance(t, inspect.StrType | inspect.BoolType | inspect.NoneType):
        return True
    if isinstance(t, inspect.LiteralType):
        return _all_str(t.values)
    if isinstance(t, inspect.EnumType):
        return _all_str([m.value for m in t.cls]) and issubclass(t.cls, str)
    if isinstance(t, inspect.UnionType):
        return all(_verbatim(member) for member in t.types)
    if isinstance(t, inspect.VarTupleType | inspect.ListType):
        return _verbatim(t.item_type)
    return False


_PLAIN, _ESCAPED = _Writers(plain=True), _Writers(plain=False)
_DECODED = {plain: _Writers(plain, decoded=True) for plain in (True, False)}  # ``stored_writer``'s, by plain strings
_dropping: dict[tuple[type, tuple[str, ...]], Callable[[Any], str]] = {}


def canonical_struct_bytes(value: msgspec.Struct, *, drop: tuple[str, ...] = ()) -> bytes:
    """``canonical_bytes(value)`` (without the fields in ``drop``) of a Struct *decoded by msgspec*
    (so an ``int`` field holds an exact int); ``Unsupported`` when that cannot be mirrored exactly."""
    try:
        if not drop:
            return (_ESCAPED.writer(type(value))(value) + "\n").encode()
        write = _dropping.get((type(value), drop))
        if write is None:
            pieces = _ESCAPED.members(type(value), "value", 0, drop)
            if pieces is None:
                raise Unsupported
            write = _dropping[type(value), drop] = _ESCAPED.function("value", pieces)
        return (write(value) + "\n").encode()
    except _ERRORS as exc:  # a float or an odd value under _reference
        raise Unsupported from exc


# -- whole envelopes: one template per body type, the body inline ---------------------------------

_Envelope = Callable[..., str]
_envelopes: dict[bool, dict[type, _Envelope]] = {True: {}, False: {}}  # by plain_strings, then body type


def _envelope(plain: bool, body: type) -> _Envelope:
    """``envelope(event)`` (``envelope(event, context_text)`` for an ``IntentRecorded``): its canonical text."""
    writers = _PLAIN if plain else _ESCAPED
    given: dict[str, _Pieces] | None = {"context": [(True, "context")]} if body is IntentRecorded else None
    inner = writers.members(body, "body", 1, given=given)
    if inner is None:
        raise Unsupported
    outer = writers.members(RecordedEvent, "value", 0, ("digest",), {"body": inner})
    if outer is None:
        raise Unsupported
    params = "value, context" if given else "value"
    _envelopes[plain][body] = write = writers.function(params, [*outer, (False, "\n")], "    body = value.body\n")
    return write  # type: ignore[no-any-return]


def recorded_canonical(event: RecordedEvent, *, plain_strings: bool = False) -> tuple[bytes, str | None]:
    """The canonical bytes of a decoded envelope (its ``digest`` left out: what its digest covers) and,
    for an ``IntentRecorded``, ``domain.decide.context_digest`` of its context: the same bytes, written once.

    ``plain_strings``: no string of the envelope needs escaping (the bytes it was decoded from hold
    no backslash), and the envelope was decoded by msgspec; then the faster plain writers apply.
    """
    try:
        body = event.body
        kind = type(body)
        write = _envelopes[plain_strings].get(kind) or _envelope(plain_strings, kind)
        if kind is IntentRecorded:
            context = (_PLAIN if plain_strings else _ESCAPED).struct(body.context)  # type: ignore[union-attr]
            quoted: str | None = digest_of(CONTEXT_PREFIX, (context + "\n").encode())
            return write(event, context).encode(), quoted
        return write(event).encode(), None
    except _ERRORS as exc:
        raise Unsupported from exc


# -- whole envelopes in the stored form: the canonical members, then the digest as a last member ----

_StoredWriter = Callable[[RecordedEvent], Any]
_stored_writers: dict[bool, dict[type, _StoredWriter]] = {True: {}, False: {}}  # by plain_strings, then body type


def stored_writer(body: type, *, plain_strings: bool) -> _StoredWriter:
    """``write(event)``: the text of the event's stored form (``domain.chain.stored_form`` of its canonical
    bytes and its ``digest``); for an ``IntentRecorded``, ``(that text, its context's canonical text)``.

    Only for an envelope decoded by ``DECODER`` (its opaque payloads are not checked again);
    ``plain_strings`` as for ``recorded_canonical``. Raises ``Unsupported`` for a body type it cannot
    mirror; the writer itself raises ``Unsupported`` or one of ``WRITE_ERRORS`` for a value it cannot.
    """
    write = _stored_writers[plain_strings].get(body)
    if write is not None:
        return write
    writers = _DECODED[plain_strings]
    intent = body is IntentRecorded
    inner = writers.members(body, "body", 1, given={"context": [(True, "context")]} if intent else None)
    if inner is None:
        raise Unsupported
    outer = writers.members(RecordedEvent, "value", 0, ("digest",), {"body": inner})
    digest = writers.scalar(inspect.StrType(), "value.digest")
    if outer is None or outer[-1] != (False, "}") or digest is None:
        raise Unsupported
    pieces: _Pieces = [*outer[:-1], (False, ',"digest":'), *digest, (False, "}")]
    prelude = "    body = value.body\n"
    if intent:  # the context's text, written once: the envelope holds it, and its digest is the intent's
        context = writers.members(IntentContext, "c", 1)
        if context is None:
            raise Unsupported
        writers.namespace["_IntentContext"] = IntentContext
        prelude += "    if type(c := body.context) is _IntentContext:\n"
        prelude += f"        context = {writers.expression(context)}\n"
        prelude += "    else:\n        context = _struct(c)\n"
    write = writers.function("value", pieces, prelude, ", context" if intent else "")
    _stored_writers[plain_strings][body] = write
    return write  # type: ignore[no-any-return]


WRITE_ERRORS = _ERRORS
"""What a generated writer may raise for a value it cannot write (besides ``Unsupported``)."""


def recorded_digest(event: RecordedEvent) -> str:
    """``domain.chain.envelope_digest`` of a decoded envelope, its ``digest`` field left out."""
    return digest_of(EVENT_PREFIX, recorded_canonical(event)[0])
