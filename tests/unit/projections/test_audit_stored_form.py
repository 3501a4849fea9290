"""The audit of stored bytes: what the ledger writes audits clean, and any other spelling under a digest
of its own is found, so the audit never passes what ``verify_chain`` refuses."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given as hypothesis_given
from hypothesis import settings
from hypothesis import strategies as st

from baton.domain.budgets import Usage
from baton.domain.canonical import canonical_bytes, digest_of
from baton.domain.chain import EVENT_PREFIX, envelope_digest, seal_stored, stored_bytes, stored_form, verify_chain
from baton.domain.commands import RenewLease, Submission
from baton.domain.decide import context_digest
from baton.domain.errors import ChainBroken
from baton.domain.events import EVENT_TYPES, IntentContext, IntentRecorded, RecordedEvent
from baton.domain.stages import Stage
from baton.projections.audit import AuditFold, audit_events, audit_stored

from ..domain.given import RUN, W1, given, intent
from .histories import histories

_lenient = msgspec.json.Decoder(RecordedEvent, strict=False)
_DIGEST_CODES = {"digest_mismatch", "noncanonical", "undecodable"}

JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=4)),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=8,
)
CONTEXTS = st.builds(IntentContext, arguments=st.dictionaries(st.text(max_size=4), JSON, max_size=3))


def well_typed(cls: type) -> st.SearchStrategy[Any]:
    """Instances of ``cls`` with values of the declared types (JSON values where it says Any)."""
    overrides: dict[str, st.SearchStrategy[Any]] = {}
    for field in msgspec.structs.fields(cls):
        if field.type is Any:
            overrides[field.name] = JSON
        elif field.type is IntentContext:
            overrides[field.name] = CONTEXTS
    return st.builds(cls, **overrides)


EVERY_BODY = st.one_of([well_typed(cls) for cls in EVENT_TYPES.values()])


def hashed_part(stored: bytes) -> bytes:
    """The bytes a stored envelope's digest covers: everything before its digest member, closed by ``}\\n``."""
    return stored[: stored.rindex(b',"digest":')] + b"}\n"


def digest_codes(stored: list[bytes]) -> set[str]:
    """The problems the audit finds with the bytes themselves (not with what they say)."""
    return {problem.code for problem in audit_stored(RUN, stored)} & _DIGEST_CODES


@settings(max_examples=400, deadline=None)
@hypothesis_given(st.lists(EVERY_BODY, min_size=1, max_size=3))
def test_the_stored_form_holds_the_hashed_bytes_and_decodes_back(bodies: list[Any]) -> None:
    """Given sealed envelopes of any event type, when put in the stored form, then it is the definition's,
    the bytes before the digest member are the canonical bytes the digest covers, a lenient decode gives
    the envelope back, and the audit finds nothing wrong with the bytes."""
    submission = Submission("s-1", RUN, W1, RenewLease(ttl_ms=1))
    sealed = seal_stored(RUN, 4, "sha256:" + "0" * 64, submission, 3, bodies, 7)
    for event, stored in sealed:
        assert stored == stored_bytes(event)
        builtins = msgspec.to_builtins(event)
        del builtins["digest"]
        assert hashed_part(stored) == canonical_bytes(builtins)
        assert digest_of(EVENT_PREFIX, canonical_bytes(builtins)) == event.digest
        assert stored.endswith(b',"digest":"' + event.digest.encode() + b'"}')
        assert _lenient.decode(stored) == event
    assert digest_codes([stored for _, stored in sealed]) == set()


def history_stored() -> list[bytes]:
    """Opened (with ceilings), leased, intent, observation, transition: the stored form of positions 1..5."""
    history = given().opened().leased(W1).intended("op-1").observed("op-1")
    history.moved_to(Stage.CANDIDATE_READY)
    return [stored_bytes(event) for event in history.log]


def self_digested(stored: bytes, old: bytes, new: bytes) -> bytes:
    """``stored`` with ``old`` replaced by ``new`` in its hashed bytes, and a digest of its own over them."""
    hashed = hashed_part(stored)
    assert old in hashed
    hashed = hashed.replace(old, new, 1)
    return stored_form(hashed, digest_of(EVENT_PREFIX, hashed))


@pytest.mark.parametrize(
    ("position", "old", "new", "code"),
    [
        (5, b'"epoch":"1"', b'"epoch":1', "digest_mismatch"),  # a bare number: not the definition's bytes
        (5, b'"epoch":"1"', b'"epoch":"1e0"', "noncanonical"),  # reads as 1, hashes as a string
        (5, b'"epoch":"1"', b'"epoch":"1.0"', "noncanonical"),
        (5, b',"epoch":"1"', b', "epoch":"1"', "digest_mismatch"),  # whitespace
        (5, b'"epoch":"1"', b'"epoch":"2","epoch":"1"', "digest_mismatch"),  # a duplicate key
        (5, b'"worker":"', b'"worke\\u0072":"', "digest_mismatch"),  # an escape the definition does not write
        (4, b'"result":null', b'"result":{"f":1.5}', "digest_mismatch"),  # a float: no canonical bytes
        (1, b'"calls":null', b'"calls":"null"', "noncanonical"),  # reads as an absent ceiling
    ],
)
def test_a_self_digested_spelling_is_found_where_verify_chain_would(
    position: int, old: bytes, new: bytes, code: str
) -> None:
    """Given an event re-spelled with a digest over its new bytes (and the log cut after it), when audited,
    then the problem is named at that position; where the definition's digest differs, verify_chain fails too."""
    stored = history_stored()[:position]
    stored[-1] = self_digested(stored[-1], old, new)

    problems = audit_stored(RUN, stored)

    assert (position, code) in {(p.position, p.code) for p in problems}
    if code == "digest_mismatch":
        with pytest.raises(ChainBroken):
            verify_chain(stored, run_id=RUN)


def test_the_canonical_stored_history_audits_clean() -> None:
    """Given the stored form of a valid history, when audited, then no problem."""
    assert audit_stored(RUN, history_stored()) == []


_EDITS = st.sampled_from(
    ['"', ",", ":", "{", "}", "[", "]", " ", "\\", "0", "1", "-", "+", ".", "e", "E", "null", "u0072"]
)


def _proves_itself(data: bytes) -> bool:
    """The bytes are exactly the stored form of the canonical bytes of what every reader decodes from
    them, and its digest is the definition's."""
    typed = _lenient.decode(data)
    envelope = msgspec.json.decode(data)
    claimed = envelope.pop("digest")
    return data == stored_bytes(typed) and claimed == typed.digest == envelope_digest(envelope)


@settings(max_examples=600, deadline=None)
@hypothesis_given(
    st.lists(EVERY_BODY, min_size=1, max_size=2),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 3), _EDITS), min_size=1, max_size=3),
)
def test_re_spelled_bytes_with_a_digest_of_their_own_pass_only_if_they_are_the_canonical_bytes(
    bodies: list[Any], edits: list[tuple[int, int, str]]
) -> None:
    """Given stored envelopes edited anywhere in their hashed bytes (text inserted, replaced or deleted) and
    digested again, when audited, then the bytes pass only if they are the canonical stored form."""
    submission = Submission("s-1", RUN, W1, RenewLease(ttl_ms=1))
    for _, stored in seal_stored(RUN, 0, "sha256:" + "0" * 64, submission, 1, bodies, 7):
        hashed = hashed_part(stored)[:-2]  # without the closing "}\n"
        for offset, cut, text in edits:
            at = offset % len(hashed)
            hashed = hashed[:at] + text.encode() + hashed[at + cut :]
        hashed += b"}\n"
        edited = stored_form(hashed, digest_of(EVENT_PREFIX, hashed))
        if not digest_codes([edited]):
            assert _proves_itself(edited)


def _intent_stored(arguments: dict[str, Any]) -> tuple[RecordedEvent, bytes]:
    context = IntentContext(0, "shell", arguments=arguments)
    body = IntentRecorded("op-0", "pure", "shell@1", context, context_digest(context), "k-0", Usage(1, 2))
    submission = Submission("s-1", RUN, W1, RenewLease(ttl_ms=1))
    ((event, stored),) = seal_stored(RUN, 0, "sha256:" + "0" * 64, submission, 1, [body], 7)
    return event, stored


@pytest.mark.parametrize(
    ("old", "new", "codes"),
    [
        (b'"i":0', b'"i":0.0', {"digest_mismatch"}),  # a float in an opaque payload
        (b'"i":0', b'"i":-0', {"digest_mismatch"}),
        (b'"i":0', b'"i":0e0', {"digest_mismatch"}),
        (b'"turn":"0"', b'"turn":0', {"digest_mismatch"}),
        (b'"turn":"0"', b'"turn":"-0"', {"noncanonical"}),
        (b'"turn":"0"', b'"turn":"0.0"', {"noncanonical"}),
        (b'"turn":"0"', b'"turn":"00"', {"undecodable"}),
        (b'"turn":"0"', b'"turn":"+0"', {"undecodable"}),
        (b'"turn":"0"', b'"turn":" 0"', {"undecodable"}),
        (b'"cmd":"pytest -q"', b'"cmd":"pytest\\u0020-q"', {"digest_mismatch"}),
        (b'"cmd":"pytest -q"', b'"cmd":"pytest -q","cmd":"pytest -q"', {"digest_mismatch"}),
        (b'"authorization":"",', b"", {"noncanonical"}),  # a defaulted field left out
    ],
)
def test_an_intent_re_spelled_is_found(old: bytes, new: bytes, codes: set[str]) -> None:
    """Given an intent's stored form re-spelled (payload number, schema integer, escape, duplicate key, a default
    left out), with a digest of its own, when audited, then the spelling is named."""
    _, stored = _intent_stored({"cmd": "pytest -q", "i": 0})
    assert digest_codes([stored]) == set()

    assert digest_codes([self_digested(stored, old, new)]) == codes


def test_whitespace_in_the_digest_member_is_no_problem_of_content() -> None:
    """Given the digest member spelled with a space (it is not hashed), when audited and verified, then both pass."""
    _, stored = _intent_stored({"cmd": "pytest -q", "i": 0})
    spaced = stored.replace(b',"digest":', b',"digest" :')

    assert digest_codes([spaced]) == set()
    assert verify_chain([spaced], run_id=RUN).events == 1


def test_other_content_in_its_canonical_spelling_passes() -> None:
    """Given an intent's payload changed (a string where a number was) and digested again in canonical form,
    when audited, then its bytes pass: it is the canonical stored form of other content (the rules judge that)."""
    event, stored = _intent_stored({"i": "0"})

    assert digest_codes([stored]) == set()
    assert _proves_itself(stored)
    assert _lenient.decode(stored) == event


def test_strings_that_need_escaping_audit_clean() -> None:
    """Given a history of intents whose strings need escaping (quotes, backslashes, control and non-ASCII
    characters), when its stored form is audited, then no problem: each digest and each context digest holds."""
    h = given().opened().leased(W1)
    for index, text in enumerate(["plain", 'say "hi"', "back\\slash", "tab\there", "é \U0001f600", "\x00", "plain"]):
        h.record(intent(f"op-{index}", "pure", arguments={text: [text, index % 2]}), alongside=True)

    assert audit_stored(RUN, [stored_bytes(event) for event in h.log]) == []


@settings(max_examples=30, deadline=None)
@hypothesis_given(histories())
def test_every_event_of_a_history_gets_its_sealed_digest(log: list[RecordedEvent]) -> None:
    """Given any history, when its envelopes are audited, then each digest is the one ``seal`` gave it."""
    assert not {problem.code for problem in audit_events(RUN, log)} & _DIGEST_CODES


def _edited(log: list[RecordedEvent], index: int, edit: Any) -> list[bytes]:
    stored = [msgspec.json.encode(event) for event in log]
    envelope = msgspec.json.decode(stored[index])
    edit(envelope)
    stored[index] = msgspec.json.encode(envelope)
    return stored


def _log() -> list[RecordedEvent]:
    h = given().opened().leased(W1)
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
def test_stored_bytes_other_than_the_stored_form_are_judged_by_the_definition(
    name: str, edit: Any, codes: list[str]
) -> None:
    """Given envelopes stored as plain JSON (an older store's form) and one of them edited, when audited,
    then exactly the problems the definition finds."""
    log = _log()
    fold = AuditFold(RUN)
    for data in _edited(log, len(log) - 1, edit):
        fold.apply_stored(data)
    assert sorted(p.code for p in fold.finish()) == sorted(codes), name


def test_keys_in_another_order_are_the_same_content() -> None:
    """Reordered keys and whitespace change no canonical byte: the audit passes them."""
    log = _log()
    stored = [msgspec.json.encode(event) for event in log]
    envelope = msgspec.json.decode(stored[-1])
    stored[-1] = msgspec.json.format(msgspec.json.encode(dict(reversed(envelope.items()))), indent=2)
    assert audit_stored(RUN, stored) == []
