"""Usage.plus: given any two usages, when added, then what ``checked_add`` per counter says."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from baton.domain import errors
from baton.domain.budgets import COUNTERS, MAX_COUNTER, Usage, checked_add

COUNTER = st.one_of(st.integers(0, 3), st.integers(MAX_COUNTER - 3, MAX_COUNTER), st.integers(0, MAX_COUNTER))
SO_FAR = st.fixed_dictionaries(dict.fromkeys(COUNTERS, COUNTER)).map(lambda counters: Usage(**counters))
CHARGES = st.fixed_dictionaries(dict.fromkeys(COUNTERS, st.one_of(COUNTER, st.integers(-2, -1)))).map(
    lambda counters: Usage(**counters)
)


def _reference(a: Usage, b: Usage) -> Usage:
    return Usage(**{name: checked_add(getattr(a, name), getattr(b, name), what=name) for name in COUNTERS})


def _outcome(add: object, a: Usage, b: Usage) -> object:
    try:
        return add(a, b)  # type: ignore[operator]
    except errors.Rejection as exc:
        return type(exc).__name__, str(exc)


def test_the_counters_are_the_usage_fields_in_order() -> None:
    """``plus`` compares the counters by position, so ``COUNTERS`` must be exactly Usage's fields."""
    assert Usage.__struct_fields__ == COUNTERS
    assert len(msgspec.structs.astuple(Usage())) == 8


@settings(max_examples=1000, deadline=None)
@given(SO_FAR, CHARGES)
def test_plus_is_checked_addition_of_every_counter(a: Usage, b: Usage) -> None:
    """For any usage so far and any charge, ``plus`` returns or raises exactly what checked addition does."""
    assert _outcome(Usage.plus, a, b) == _outcome(_reference, a, b)
