"""The audit's digest fast path writes the reference's canonical bytes exactly, or steps aside."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import event as tally
from hypothesis import strategies as st

from baton.domain.budgets import Usage
from baton.domain.canonical import canonical_bytes, digest_of
from baton.domain.chain import EVENT_PREFIX, stored_bytes
from baton.domain.decide import CONTEXT_PREFIX, context_digest
from baton.domain.events import (
    EVENT_TYPES,
    IntentContext,
    IntentReconciled,
    IntentRecorded,
    ObservationRecorded,
    RecordedEvent,
)
from baton.projections.audit import AuditFold, audit_stored
from baton.projections.audit_digest import (
    DECODER,
    WRITE_ERRORS,
    Unsupported,
    canonical_struct_bytes,
    recorded_canonical,
    recorded_digest,
    stored_writer,
)

from ..domain.given import RUN, W1, intent
from ..domain.given import given as history
from .histories import histories

INT64 = st.integers(-(2**63), 2**63 - 1)
KEYS = st.sampled_from(["a", "b", "arguments", "result", "é", "\U0001f600", "Z", ""]) | st.text(max_size=4)
JSON = st.recursive(
    st.none() | st.booleans() | INT64 | st.text(max_size=6) | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=8,
)
CONTEXTS = st.builds(IntentContext, turn=INT64, arguments=st.dictionaries(KEYS, JSON, max_size=3))
_OVERRIDES: dict[type[Any], dict[str, st.SearchStrategy[Any]]] = {
    IntentRecorded: {"context": CONTEXTS},
    ObservationRecorded: {"result": JSON},
    IntentReconciled: {"result": JSON},
}
BODIES = st.one_of([st.builds(cls, **_OVERRIDES.get(cls, {})) for cls in EVENT_TYPES.values()])
ENVELOPES = st.builds(RecordedEvent, run_id=st.text(max_size=5), position=INT64, epoch=INT64, body=BODIES)


def reference(event: RecordedEvent) -> bytes | type[Exception]:
    builtins = msgspec.to_builtins(event)
    del builtins["digest"]
    try:
        return canonical_bytes(builtins)
    except (TypeError, ValueError) as exc:
        return type(exc)


@settings(deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(ENVELOPES)
def test_the_bytes_of_a_decoded_envelope_are_the_reference_bytes(event: RecordedEvent) -> None:
    """For an envelope of any event type, decoded from its stored bytes: the reference's bytes, or Unsupported."""
    try:
        stored = msgspec.json.encode(event)
    except OverflowError:  # an int past 64 bits: the ledger cannot store it either
        return
    decoded = msgspec.json.decode(stored, type=RecordedEvent)
    try:
        fast: bytes | type[Exception] = canonical_struct_bytes(decoded, drop=("digest",))
    except Unsupported:
        fast = Unsupported
    expected = reference(decoded)
    if fast is Unsupported:  # stepping aside is always allowed; what it must never do is invent bytes
        tally("the fast path stepped aside")
    else:
        assert fast == expected


@settings(deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(ENVELOPES)
def test_the_digests_of_a_decoded_envelope_are_the_reference_digests(event: RecordedEvent) -> None:
    """Given any decoded envelope, then both digests (envelope, intent context) are the reference's, or Unsupported.

    The plain writers (strings between quotes as they are) are tried only where the fold uses them:
    when the stored bytes hold no backslash.
    """
    try:
        stored = msgspec.json.encode(event)
    except OverflowError:
        return
    decoded = msgspec.json.decode(stored, type=RecordedEvent)
    expected = reference(decoded)
    body = decoded.body
    for plain in (False, True) if b"\\" not in stored else (False,):
        try:
            canonical, quoted = recorded_canonical(decoded, plain_strings=plain)
            digest = digest_of(EVENT_PREFIX, canonical)
        except Unsupported:
            tally("the fast path stepped aside")
            continue
        assert isinstance(expected, bytes)
        assert digest == digest_of(EVENT_PREFIX, expected)
        assert quoted == (context_digest(body.context) if isinstance(body, IntentRecorded) else None)


def test_plain_and_escaped_strings_and_remembered_charges_give_the_sealed_digests() -> None:
    """Given sealed intents with strings that need escaping, and repeated charges, then each digest is as sealed."""
    h = history().opened().leased(W1)
    for index, text in enumerate(["plain", 'say "hi"', "back\\slash", "tab\there", "é \U0001f600", "plain"]):
        h.record(intent(f"op-{index}", "pure", arguments={"cmd": text, "n": index % 2}))
    for event in h.log:
        stored = msgspec.json.encode(event)
        decoded = msgspec.json.decode(stored, type=RecordedEvent)
        digest = digest_of(EVENT_PREFIX, recorded_canonical(decoded, plain_strings=b"\\" not in stored)[0])
        assert digest == recorded_digest(decoded) == event.digest
    charges = [Usage(1, 2), Usage(1, 3), Usage(1, 2), Usage(calls=1)]
    for charge in charges:  # the remembered text of a charge is its own, whatever came before
        body = msgspec.structs.replace(h.log[-1].body, charge=charge)  # type: ignore[type-var]
        event = msgspec.structs.replace(h.log[-1], body=body)
        builtins = msgspec.to_builtins(event)
        del builtins["digest"]
        assert recorded_canonical(event, plain_strings=True)[0] == canonical_bytes(builtins)


@settings(max_examples=30, deadline=None)
@given(histories())
def test_every_event_of_a_history_gets_its_sealed_digest(log: list[RecordedEvent]) -> None:
    """``recorded_digest`` of each sealed envelope is the digest ``seal`` gave it."""
    assert [recorded_digest(event) for event in log] == [event.digest for event in log]


def _edited(log: list[RecordedEvent], index: int, edit: Any) -> list[bytes]:
    stored = [msgspec.json.encode(event) for event in log]
    envelope = msgspec.json.decode(stored[index])
    edit(envelope)
    stored[index] = msgspec.json.encode(envelope)
    return stored


def _log() -> list[RecordedEvent]:
    h = history().opened().leased(W1)
    h.record(intent("op-1", "pure", arguments={"b": 1, "a": [2, "x"]}))
    return h.log


@pytest.mark.parametrize(
    ("name", "edit", "codes"),
    [
        ("a defaulted field left out", lambda env: env["body"]["context"].pop("authorization"), ["digest_mismatch"]),
        ("a field added", lambda env: env["body"].__setitem__("extra", ""), ["digest_mismatch", "undecodable"]),
        (
            "an opaque int made a float",
            lambda env: env["body"]["context"]["arguments"].__setitem__("b", 1.0),
            ["digest_mismatch", "context_digest_mismatch"],
        ),
        ("a schema int as its decimal string", lambda env: env["body"]["context"].__setitem__("turn", "1"), []),
    ],
)
def test_stored_bytes_other_than_the_encoding_take_the_reference_path(name: str, edit: Any, codes: list[str]) -> None:
    """Bytes that are not msgspec's encoding of their typed decode are judged by the reference definition."""
    log = _log()
    fold = AuditFold(RUN)
    for data in _edited(log, len(log) - 1, edit):
        fold.apply_stored(data)
    assert sorted(p.code for p in fold.finish()) == sorted(codes), name


def test_keys_in_another_order_are_the_same_content() -> None:
    """Reordered keys and whitespace change no canonical byte: the reference path accepts them."""
    log = _log()
    stored = [msgspec.json.encode(event) for event in log]
    envelope = msgspec.json.decode(stored[-1])
    stored[-1] = msgspec.json.format(msgspec.json.encode(dict(reversed(envelope.items()))), indent=2)
    assert audit_stored(RUN, stored) == []


@settings(deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(ENVELOPES)
def test_the_stored_form_written_from_a_decoded_envelope_is_the_definition(event: RecordedEvent) -> None:
    """Given any envelope decoded by the fold's ``DECODER``, then ``stored_writer`` writes exactly
    ``domain.chain.stored_bytes`` of it (and an intent's context exactly as ``context_digest`` hashes it),
    in both modes where the fold uses them; a float never decodes, and Unsupported is only ever stepping aside."""
    try:
        stored = msgspec.json.encode(event)
    except OverflowError:
        return
    try:
        decoded = DECODER.decode(stored)
    except Unsupported:  # a float in a payload: the reference refuses it too
        assert not isinstance(reference(msgspec.json.decode(stored, type=RecordedEvent)), bytes)
        return
    expected = stored_bytes(decoded)
    for plain in (False, True) if b"\\" not in stored else (False,):
        try:
            written = stored_writer(type(decoded.body), plain_strings=plain)(decoded)
        except (Unsupported, *WRITE_ERRORS):
            continue
        body = decoded.body
        if isinstance(body, IntentRecorded):
            text, context = written
            assert digest_of(CONTEXT_PREFIX, (context + "\n").encode()) == context_digest(body.context)
        else:
            text = written
        assert text.encode() == expected
