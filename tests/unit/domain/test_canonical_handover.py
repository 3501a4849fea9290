"""What ``decide`` writes once and hands on must be exactly what would have been written again.

An intent's context is written for its digest and spliced into the event (``struct_canonical_bytes``
with ``given``); charges of integers are remembered by their plain text. Both are shortcuts of the
canonical form, so each is pinned here to the definition, odd values included.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from baton.domain.budgets import Usage
from baton.domain.canonical import ZERO_DIGEST, _reference_bytes, canonical_bytes, digest_of, struct_canonical_bytes
from baton.domain.chain import EVENT_PREFIX, envelope_bytes, seal_stored, stored_bytes, stored_form
from baton.domain.commands import RecordIntent
from baton.domain.decide import decide
from baton.domain.events import IntentContext, RecordedEvent

from .given import given as history
from .test_canonical_differential import JSON, Number, outcome

ARGUMENTS = st.one_of(
    st.dictionaries(st.text(max_size=4), JSON, max_size=3),
    st.just({"limit": 10, "query": 'weather in "paris"\n'}),
    st.just({"nested": (1, [True, None])}),  # a tuple: written as a list
    st.just({"set": frozenset({8, 1})}),  # not plain (the reference writes it, sorted); iterates as 8, 1
)
CONTEXTS = st.builds(
    IntentContext,
    turn=st.integers(0, 2**70),
    operation=st.text(max_size=6),
    authorization=st.sampled_from(["", "grant:g-1"]),
    state_digest=st.text(max_size=3),
    arguments=ARGUMENTS,
)


ID_CHARACTERS = st.characters(codec="utf-8", exclude_characters="\x00")  # ids hold no NUL (malformed)


@settings(max_examples=300, deadline=None)
@given(CONTEXTS, st.text(ID_CHARACTERS, min_size=1, max_size=5))
def test_an_intent_handed_on_encodes_and_seals_as_the_definition(context: IntentContext, op_id: str) -> None:
    """Given a leased run, when an intent is decided with ``encoded``, then the same events, the
    handed-on bytes are the body's canonical bytes, and sealing with them gives the same envelopes."""
    run = history().opened().leased()
    submission = run.submission(RecordIntent(op_id, "pure", "tools.search@1", context, "key-1"))
    encoded: list[bytes | None] = []
    bodies = decide(run.state, submission, run.now, encoded)

    assert bodies == decide(run.state, submission, run.now)
    assert encoded == [_reference_bytes(bodies[0], opaque=False)[:-1]]
    args = (run.state.run_id, run.state.version, run.state.head_digest, submission, run.state.epoch, bodies, run.now)
    sealed = seal_stored(*args, encoded)
    assert [stored for _, stored in sealed] == [stored_bytes(event) for event, _ in sealed]
    assert sealed == seal_stored(*args)


def test_a_field_that_is_not_there_leaves_the_caller_to_its_definition() -> None:
    """Given text for a field the class does not have, when encoded, then None (never a guess)."""
    context = IntentContext(turn=1, operation="search")
    assert struct_canonical_bytes(context, given=("no_such_field", b'"x"')) is None
    assert struct_canonical_bytes(context, given=("arguments", b"{}")) == canonical_bytes(context)[:-1]


# Values that equal a remembered integer (``True == 1``, ``Number.ONE == 1``, ``1.0 == 1``) or
# write as a similar text; each must still be written as the reference writes it.
ODD = st.one_of(
    st.booleans(),
    st.sampled_from([Number.ONE, 1.0, -0.0, "1", None, 2**64, msgspec.Raw(b"1")]),
    st.integers(-2, 2),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-2, 2), ODD), min_size=1, max_size=6))
def test_remembered_charges_are_written_as_the_reference(pairs: list[tuple[int, Any]]) -> None:
    """Given a charge of exact ints (remembered) and then a look-alike holding an odd value, when each
    is encoded, then each gives the reference's bytes or error."""
    for number, odd in pairs:
        for usage in (Usage(calls=number, fuel=number), Usage(calls=odd, fuel=number)):
            assert outcome(canonical_bytes, usage, False) == outcome(_reference_bytes, usage, False)


class _Counters(msgspec.Struct):
    """Integers only, like ``Usage``, but not frozen: the same object may hold other values later."""

    hits: int = 0
    misses: int = 0


def test_a_changeable_value_is_not_remembered_by_identity() -> None:
    """Given a non-frozen Struct of ints encoded once, when the same object is changed and encoded
    again, then its new text; and a frozen ``Usage`` encoded twice, then another, gives each its own."""
    counters = _Counters(hits=1)
    assert canonical_bytes(counters) == b'{"hits":"1","misses":"0"}\n'
    counters.hits = 2
    assert canonical_bytes(counters) == b'{"hits":"2","misses":"0"}\n'

    charge = Usage(calls=1, argument_bytes=7)
    assert canonical_bytes(charge) == canonical_bytes(charge) == _reference_bytes(charge, opaque=False)
    other = Usage(calls=1, argument_bytes=8)
    assert canonical_bytes(other) == _reference_bytes(other, opaque=False)


class _Name(str):
    """A ``str`` subclass: equal to its plain value, but not of the exact type the template is for."""


# Envelope fields from small pools, so that consecutive envelopes often share the members that are
# kept, or differ only in a value that equals another (``True == 1``, a ``str`` subclass), or need
# escaping (``%`` is the template's own marker): each envelope must still be the definition.
ENVELOPES = st.tuples(
    st.sampled_from(["run-1", _Name("run-1"), "r%d-%b", 'r"\\%']),
    st.sampled_from(["w-1", _Name("w-1"), "w%%"]),
    st.sampled_from([1, True, 2, Number.ONE, 2**64]),
    st.sampled_from([0, 1, False, 2**64]),
    st.sampled_from(["s-1", _Name("s-1"), "%b"]),
)


def _sealed_or_error(seal: Any) -> tuple[Any, ...]:
    try:
        return ("ok", seal())
    except Exception as exc:  # the error must match too: same type, same message
        return ("error", type(exc), str(exc))


@settings(max_examples=300, deadline=None)
@given(st.lists(ENVELOPES, min_size=2, max_size=6))
def test_envelopes_sealed_one_after_another_are_each_the_definition(
    envelopes: list[tuple[str, str, int, int, str]],
) -> None:
    """Given envelopes sealed in turn (the members the last one shared are kept), when each is sealed,
    then its stored form is the definition's, or the definition's error."""
    run = history().opened().leased()
    submission = run.submission(RecordIntent("op-1", "pure", "tools.x@1", IntentContext(turn=1, operation="x"), "k-1"))
    body = decide(run.state, submission, run.now)[0]
    for run_id, worker, epoch, now, submission_id in envelopes:
        sent = msgspec.structs.replace(submission, worker=worker, submission_id=submission_id)
        event = RecordedEvent(run_id, 1, epoch, worker, submission_id, now, ZERO_DIGEST, body)
        canonical = _sealed_or_error(lambda event=event: envelope_bytes(event))
        expected = (
            ("ok", stored_form(canonical[1], digest_of(EVENT_PREFIX, canonical[1])))
            if canonical[0] == "ok"
            else canonical
        )
        sealed = _sealed_or_error(lambda: seal_stored(run_id, 0, ZERO_DIGEST, sent, epoch, [body], now)[0][1])  # noqa: B023
        assert sealed == expected
