"""The audit's fast path for the stored form: what the ledger writes proves itself; any other spelling under a
digest of its own goes the reference way, so the audit never passes what ``verify_chain`` refuses."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given as hypothesis_given
from hypothesis import settings
from hypothesis import strategies as st

from baton.domain.budgets import Usage
from baton.domain.canonical import digest_of
from baton.domain.chain import (
    EVENT_PREFIX,
    envelope_digest,
    hashed_part,
    seal_stored,
    stored_bytes,
    stored_form,
    verify_chain,
)
from baton.domain.commands import RenewLease, Submission
from baton.domain.decide import context_digest
from baton.domain.errors import ChainBroken
from baton.domain.events import IntentContext, IntentRecorded, RecordedEvent
from baton.domain.stages import Stage
from baton.projections.audit import AuditFold, audit_stored
from baton.projections.audit_digest import DECODER, Unsupported

from ..domain.given import RUN, W1, given
from ..domain.test_canonical_differential import EVERY_BODY

_lenient = msgspec.json.Decoder(RecordedEvent, strict=False)


@settings(max_examples=400, deadline=None)
@hypothesis_given(st.lists(EVERY_BODY, min_size=1, max_size=3))
def test_what_the_ledger_stores_takes_the_fast_path(bodies: list[Any]) -> None:
    """Given sealed envelopes of any event type, when their stored form is checked, then it proves itself."""
    submission = Submission("s-1", "run-é", "w-1", RenewLease(ttl_ms=1))
    for event, stored in seal_stored("run-é", 4, "sha256:" + "0" * 64, submission, 3, bodies, 7):
        assert AuditFold("run-é")._verified(stored) == event


def history_stored() -> list[bytes]:
    """Opened (with ceilings), leased, intent, observation, transition: the stored form of positions 1..5."""
    history = given().opened().leased(W1).intended("op-1").observed("op-1")
    history.moved_to(Stage.CANDIDATE_READY)
    return [stored_bytes(event) for event in history.log]


def self_digested(stored: bytes, old: bytes, new: bytes) -> bytes:
    """``stored`` with ``old`` replaced by ``new`` in its hashed bytes, and a digest of its own over them."""
    split = hashed_part(stored)
    assert split is not None and old in split[0]
    hashed = split[0].replace(old, new, 1)
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
    assert AuditFold(RUN)._verified(stored[-1]) is None  # the reference path decides

    problems = audit_stored(RUN, stored)

    assert (position, code) in {(p.position, p.code) for p in problems}
    if code == "digest_mismatch":
        with pytest.raises(ChainBroken):
            verify_chain(stored, run_id=RUN)


def test_the_canonical_stored_history_audits_clean_on_the_fast_path() -> None:
    """Given the stored form of a valid history, when audited, then no problem and every event is canonical."""
    stored = history_stored()
    assert audit_stored(RUN, stored) == []
    assert all(AuditFold(RUN)._verified(data) is not None for data in stored)


# -- the fast path against the reference definition, over re-spelled bytes -----------------------

_EDITS = st.sampled_from(
    ['"', ",", ":", "{", "}", "[", "]", " ", "\\", "0", "1", "-", "+", ".", "e", "E", "null", "u0072"]
)


def _proves_itself(data: bytes) -> bool:
    """The reference's verdict on bytes the fast path accepted: they are exactly the stored form of the
    canonical bytes of what every reader decodes from them, and its digest is the definition's."""
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
    digested again, when the fast path checks them, then it passes only bytes the reference passes as canonical."""
    submission = Submission("s-1", RUN, W1, RenewLease(ttl_ms=1))
    for _, stored in seal_stored(RUN, 0, "sha256:" + "0" * 64, submission, 1, bodies, 7):
        split = hashed_part(stored)
        assert split is not None
        hashed = split[0][:-2]  # without the closing "}\n"
        for offset, cut, text in edits:
            at = offset % len(hashed)
            hashed = hashed[:at] + text.encode() + hashed[at + cut :]
        hashed += b"}\n"
        edited = stored_form(hashed, digest_of(EVENT_PREFIX, hashed))
        if AuditFold(RUN)._verified(edited) is not None:
            assert _proves_itself(edited)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b'"i":0', b'"i":0.0'),  # a float in an opaque payload
        (b'"i":0', b'"i":-0'),
        (b'"i":0', b'"i":0e0'),
        (b'"turn":"0"', b'"turn":0'),
        (b'"turn":"0"', b'"turn":"-0"'),
        (b'"turn":"0"', b'"turn":"0.0"'),
        (b'"turn":"0"', b'"turn":"00"'),
        (b'"turn":"0"', b'"turn":"+0"'),
        (b'"turn":"0"', b'"turn":" 0"'),
        (b'"cmd":"pytest -q"', b'"cmd":"pytest\\u0020-q"'),
        (b'"cmd":"pytest -q"', b'"cmd":"pytest -q","cmd":"pytest -q"'),
        (b'"authorization":"",', b""),  # a defaulted field left out
        (b',"digest":', b',"digest" :'),
    ],
)
def test_an_intent_re_spelled_takes_the_reference_path(old: bytes, new: bytes) -> None:
    """Given an intent's stored form re-spelled (payload number, schema integer, escape, duplicate key, a default
    left out), with a digest of its own, when checked, then the fast path steps aside for the reference."""
    context = IntentContext(0, "shell", arguments={"cmd": "pytest -q", "i": 0})
    body = IntentRecorded("op-0", "pure", "shell@1", context, context_digest(context), "k-0", Usage(1, 2))
    submission = Submission("s-1", RUN, W1, RenewLease(ttl_ms=1))
    ((_, stored),) = seal_stored(RUN, 0, "sha256:" + "0" * 64, submission, 1, [body], 7)
    assert AuditFold(RUN)._verified(stored) is not None
    split = hashed_part(stored)
    assert split is not None
    if old.startswith(b',"digest"'):
        edited = stored.replace(old, new)
    else:
        assert old in split[0]
        hashed = split[0].replace(old, new, 1)
        edited = stored_form(hashed, digest_of(EVENT_PREFIX, hashed))
    assert AuditFold(RUN)._verified(edited) is None


def test_other_content_in_its_canonical_spelling_takes_the_fast_path() -> None:
    """Given an intent's payload changed (a string where a number was) and digested again in canonical form,
    when checked, then it passes: it is the canonical stored form of other content (the rules judge the content)."""
    context = IntentContext(0, "shell", arguments={"i": "0"})
    body = IntentRecorded("op-0", "pure", "shell@1", context, context_digest(context), "k-0", Usage(1, 2))
    submission = Submission("s-1", RUN, W1, RenewLease(ttl_ms=1))
    ((event, stored),) = seal_stored(RUN, 0, "sha256:" + "0" * 64, submission, 1, [body], 7)
    assert AuditFold(RUN)._verified(stored) == event
    assert _proves_itself(stored)


def test_strings_that_need_escaping_take_the_fast_path() -> None:
    """Given envelopes whose strings need escaping (quotes, backslashes, control and non-ASCII characters),
    when their stored form is checked, then the escaping writers prove it."""
    submission = Submission("s-1", 'run "é"', "w\\1", RenewLease(ttl_ms=1))
    bodies = [
        IntentRecorded(
            f"op-{index}",
            "pure",
            "shell@1",
            IntentContext(index, "shell", arguments={text: [text, index]}),
            context_digest(IntentContext(index, "shell", arguments={text: [text, index]})),
            text,
            Usage(1),
        )
        for index, text in enumerate(['say "hi"', "back\\slash", "tab\there", "é \U0001f600", "\x00"])
    ]
    fold = AuditFold('run "é"')
    for event, stored in seal_stored('run "é"', 0, "sha256:" + "0" * 64, submission, 1, bodies, 7):
        typed = fold._verified(stored)
        assert typed == event
        assert typed is not None and fold.state.context_checked is typed.body.context  # type: ignore[union-attr]


def test_the_fold_decoder_refuses_a_float_wherever_a_payload_is_untyped() -> None:
    """Given stored bytes with a float in an opaque payload, when decoded for the fast path, then Unsupported."""
    (stored,) = history_stored()[3:4]  # the observation (result null)
    with pytest.raises(Unsupported):
        DECODER.decode(stored.replace(b'"result":null', b'"result":{"f":[1,2.5]}'))
    assert DECODER.decode(stored) == _lenient.decode(stored)
