"""Usage.plus: given a usage and a charge, when added, then checked addition of every counter."""

from __future__ import annotations

import msgspec
import pytest

from baton.domain import errors
from baton.domain.budgets import COUNTERS, MAX_COUNTER, Price, Usage


def test_the_counters_are_the_usage_fields_in_order() -> None:
    """``COUNTERS`` names every field of Usage, so every counter is checked and reported by its name."""
    assert Usage.__struct_fields__ == COUNTERS
    assert len(msgspec.structs.astuple(Usage())) == len(COUNTERS)


def test_plus_adds_every_counter() -> None:
    """Each counter of the sum is the sum of the two counters."""
    so_far = Usage(**{name: index for index, name in enumerate(COUNTERS, 1)})
    charge = Usage(**{name: 10 * index for index, name in enumerate(COUNTERS, 1)})

    assert so_far.plus(charge) == Usage(**{name: 11 * index for index, name in enumerate(COUNTERS, 1)})


@pytest.mark.parametrize("name", COUNTERS)
def test_a_negative_charge_is_malformed_and_named(name: str) -> None:
    """A charge with a negative counter is refused, naming that counter."""
    with pytest.raises(errors.Malformed, match=f"^{name} cannot be negative"):
        Usage().plus(Usage(**{name: -1}))


def test_the_first_counter_past_the_maximum_is_named() -> None:
    """Given two counters that would overflow, when added, then the first of them (in COUNTERS order) is named."""
    full = Usage(fuel=MAX_COUNTER, stages=MAX_COUNTER)

    with pytest.raises(errors.CounterOverflow, match=r"^fuel would overflow"):
        full.plus(Usage(fuel=1, stages=1))


def test_a_price_rounds_a_fraction_of_a_micro_unit_up() -> None:
    """Given $0.15 per million tokens, when one token is charged, then it costs one micro-unit, not zero."""
    assert Price(input_per_mtok=150_000).cost_micros(1, 0) == 1
    assert Price(input_per_mtok=150_000).cost_micros(0, 0) == 0
    with pytest.raises(errors.Malformed):
        Price(input_per_mtok=-1).cost_micros(1, 0)
