"""The fast path of ``canonical_bytes`` is byte-for-byte the reference encoder, errors included.

Digests are forever: a stored event must verify with every later build. The fast path for plain
builtin values must therefore give exactly the reference's bytes, or exactly its error, for any
value, opaque or not.
"""

from __future__ import annotations

import enum
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from domain.budgets import Usage
from domain.canonical import _reference_bytes, canonical_bytes
from domain.events import IntentContext


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
