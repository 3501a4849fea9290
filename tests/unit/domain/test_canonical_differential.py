"""The fast paths of ``canonical_bytes`` and ``seal`` are byte-for-byte the reference, errors included.

Digests are forever: a stored event must verify with every later build. The fast path for plain
builtin values must therefore give exactly the reference's bytes, or exactly its error, for any
value, opaque or not.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from baton.domain.budgets import Usage
from baton.domain.canonical import _reference_bytes, canonical_bytes, digest_of
from baton.domain.chain import EVENT_PREFIX, envelope_digest, hashed_part, seal, seal_stored, stored_bytes
from baton.domain.commands import ReleaseLease, RenewLease, Submission
from baton.domain.events import (
    EVENT_TYPES,
    BlobRef,
    IntentContext,
    IntentRecorded,
    ObservationRecorded,
    RecordedEvent,
    TransitionRecorded,
)
from baton.domain.stages import Stage


class Color(enum.Enum):
    RED = "red"


class Number(enum.IntEnum):
    ONE = 1


KEYS = st.one_of(
    st.sampled_from(["arguments", "result", "turn", "a", "b", "size"]),
    st.text(max_size=4),
    st.integers(-3, 3),
    st.none(),
    st.booleans(),
)
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**63, max_value=2**80),
    st.text(max_size=5),
    st.floats(allow_nan=True),
    st.just(Color.RED),
    st.just(Number.ONE),
    st.builds(Usage, calls=st.integers(0, 5)),
    st.frozensets(st.text(max_size=2), max_size=3),
    st.sets(st.integers(0, 9), max_size=3),
    st.binary(max_size=3),
)
VALUES = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.dictionaries(KEYS, children, max_size=4),
        st.builds(
            IntentContext,
            turn=st.integers(0, 9),
            operation=st.text(max_size=3),
            arguments=st.dictionaries(KEYS, children, max_size=3),
        ),
    ),
    max_leaves=12,
)


def outcome(encode: Any, value: Any, opaque: bool) -> tuple[Any, ...]:
    try:
        return ("ok", encode(value, opaque=opaque))
    except Exception as exc:  # the error must match too: same type, same message
        return ("error", type(exc), str(exc))


@settings(max_examples=600, deadline=None)
@given(VALUES, st.booleans())
def test_fast_path_equals_the_reference_encoder(value: Any, opaque: bool) -> None:
    """For any value, the fast path gives the reference's bytes or the reference's error."""
    assert outcome(canonical_bytes, value, opaque) == outcome(_reference_bytes, value, opaque)


# Struct construction checks no types, so any value may sit in any field of an event: the fast
# paths must still give the reference's bytes or error.
ANY_FIELD = st.one_of(st.text(max_size=4), LEAVES, VALUES, st.sampled_from(list(Stage)))
BODIES = st.one_of(
    st.builds(
        IntentRecorded,
        op_id=ANY_FIELD,
        kind=st.sampled_from(["pure", "effect"]),
        tool_contract=st.text(max_size=4),
        context=st.one_of(VALUES.filter(lambda v: isinstance(v, IntentContext)), ANY_FIELD),
        context_digest=ANY_FIELD,
        idempotency_key=st.text(max_size=4),
        charge=st.one_of(st.builds(Usage, calls=st.integers(0, 5), fuel=st.integers(0, 2**70)), ANY_FIELD),
    ),
    st.builds(
        TransitionRecorded,
        from_stage=st.sampled_from(list(Stage)),
        to_stage=ANY_FIELD,
        state_digest=st.text(max_size=4),
        charge=st.builds(Usage, stages=st.integers(0, 3)),
        state_ref=st.one_of(st.none(), st.builds(BlobRef, st.text(max_size=3), st.integers(-2, 2**65), ANY_FIELD)),
    ),
    st.builds(ObservationRecorded, op_id=st.text(max_size=3), context_digest=ANY_FIELD,
              outcome=st.just("ok"), charge=st.builds(Usage), result=ANY_FIELD),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(BODIES)
def test_event_bodies_encode_as_the_reference_encoder(body: Any) -> None:
    """For an event body holding any values, the fast path gives the reference's bytes or error."""
    assert outcome(canonical_bytes, body, False) == outcome(_reference_bytes, body, False)


def sealed_by_definition(head: int, submission: Submission, bodies: list[Any]) -> list[RecordedEvent]:
    """The definition: an envelope's digest is that of its builtins without the digest key."""
    sealed, prev = [], "sha256:" + "0" * 64
    for offset, body in enumerate(bodies, start=1):
        draft = RecordedEvent("run-é", head + offset, 3, submission.worker, submission.submission_id, 7, prev, body)
        builtins = msgspec.to_builtins(draft, order="deterministic")  # sets sorted, as the canonical form says
        del builtins["digest"]
        sealed.append(msgspec.structs.replace(draft, digest=envelope_digest(builtins)))
        prev = sealed[-1].digest
    return sealed


@settings(max_examples=300, deadline=None)
@given(st.lists(BODIES, min_size=1, max_size=3), st.text(max_size=4), st.text(max_size=4))
def test_seal_gives_the_digests_of_the_definition(bodies: list[Any], worker: str, submission_id: str) -> None:
    """``seal`` assembles envelopes around their bodies' bytes: same digests (or error) as the definition."""
    submission = Submission(submission_id, "run-é", worker, RenewLease(ttl_ms=1))

    def run(sealer: Any) -> tuple[Any, ...]:
        try:
            return ("ok", sealer())
        except Exception as exc:
            return ("error", type(exc), str(exc))

    fast = run(lambda: seal("run-é", 4, "sha256:" + "0" * 64, submission, 3, bodies, 7))
    assert fast == run(lambda: sealed_by_definition(4, submission, bodies))


# Every event type, well typed: each class gets its own compiled encoder, so each is checked.
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


@settings(max_examples=600, deadline=None)
@given(st.lists(EVERY_BODY, min_size=1, max_size=3))
def test_every_event_type_encodes_and_seals_as_the_definition(bodies: list[Any]) -> None:
    """Given well-typed bodies of any event type, when encoded and sealed, then the reference's bytes and digests."""
    for body in bodies:
        assert canonical_bytes(body) == _reference_bytes(body, opaque=False)
    submission = Submission("s-1", "run-é", "w-1", RenewLease(ttl_ms=1))
    assert seal("run-é", 4, "sha256:" + "0" * 64, submission, 3, bodies, 7) == sealed_by_definition(
        4, submission, bodies
    )


@settings(max_examples=400, deadline=None)
@given(st.lists(EVERY_BODY, min_size=1, max_size=3))
def test_the_stored_form_holds_the_hashed_bytes_and_decodes_back(bodies: list[Any]) -> None:
    """Given sealed envelopes of any event type, when put in the stored form, then it is the definition's,
    cutting off the digest gives the canonical bytes the digest covers, and a lenient decode gives the envelope."""
    submission = Submission("s-1", "run-é", "w-1", RenewLease(ttl_ms=1))
    for event, stored in seal_stored("run-é", 4, "sha256:" + "0" * 64, submission, 3, bodies, 7):
        assert stored == stored_bytes(event)
        builtins = msgspec.to_builtins(event)
        del builtins["digest"]
        assert hashed_part(stored) == (canonical_bytes(builtins), event.digest.encode())
        assert digest_of(EVENT_PREFIX, canonical_bytes(builtins)) == event.digest
        assert msgspec.json.decode(stored, type=RecordedEvent, strict=False) == event


@pytest.mark.parametrize("data", [b"", b"{}", b'{"digest":"sha256:' + b"0" * 64 + b'"', b'{"a":"1"}' + b" " * 90])
def test_bytes_not_in_the_stored_form_have_no_hashed_part(data: bytes) -> None:
    """Given bytes without the stored form's last member, when split, then None (the reference path's)."""
    assert hashed_part(data) is None


class Tagged(msgspec.Struct, tag="a%b"):
    """A tag holding a ``%``, which the compiled template must escape."""


@pytest.mark.parametrize(
    "value",
    [
        ReleaseLease(),  # tagged, no fields
        msgspec.defstruct("Empty", [])(),  # untagged, no fields
        msgspec.defstruct("Keyword", [("class", int)])(1),  # a field Python source cannot name
        Tagged(),
    ],
    ids=["tag-only", "empty", "keyword-field", "percent-tag"],
)
def test_unusual_struct_classes_encode_as_the_reference(value: Any) -> None:
    """Given a Struct class of an unusual shape, when encoded, then the reference's bytes."""
    assert canonical_bytes(value) == _reference_bytes(value, opaque=False)
