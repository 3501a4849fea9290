"""Budget ceilings and cumulative usage with checked integer arithmetic.

Counters are non-negative integers bounded by the SQL ``bigint`` range, so a value that fits the
domain always fits every store; usage only ever grows (nothing is refunded).
"""

from __future__ import annotations

import msgspec

from baton.domain.errors import BudgetExceeded, CounterOverflow, Malformed

__all__ = ["COUNTERS", "MAX_COUNTER", "Ceilings", "Price", "Usage", "checked_add"]

MAX_COUNTER = 2**63 - 1

COUNTERS = (
    "calls",
    "argument_bytes",
    "result_bytes",
    "fuel",
    "cost_micros",
    "iterations",
    "stages",
    "reserved_fuel",
)


def checked_add(a: int, b: int, *, what: str = "counter") -> int:
    """Add two counters, refusing negatives and results past ``MAX_COUNTER``."""
    if a < 0 or b < 0:
        msg = f"{what} cannot be negative ({a} + {b})"
        raise Malformed(msg)
    total = a + b
    if total > MAX_COUNTER:
        msg = f"{what} would overflow ({a} + {b} > {MAX_COUNTER})"
        raise CounterOverflow(msg)
    return total


class Usage(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What a run has consumed so far (or what one submission adds)."""

    calls: int = 0
    argument_bytes: int = 0
    result_bytes: int = 0
    fuel: int = 0
    cost_micros: int = 0
    iterations: int = 0
    stages: int = 0
    reserved_fuel: int = 0

    def plus(self, other: Usage) -> Usage:
        """Checked addition of every counter (``checked_add``, which names the counter it refuses)."""
        return Usage(**{name: checked_add(getattr(self, name), getattr(other, name), what=name) for name in COUNTERS})

    def validate(self) -> None:
        for name in COUNTERS:
            value = getattr(self, name)
            if not 0 <= value <= MAX_COUNTER:
                msg = f"usage.{name} must be between 0 and {MAX_COUNTER}, got {value}"
                raise Malformed(msg)


class Ceilings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Upper bounds per counter; ``None`` means unbounded."""

    calls: int | None = None
    argument_bytes: int | None = None
    result_bytes: int | None = None
    fuel: int | None = None
    cost_micros: int | None = None
    iterations: int | None = None
    stages: int | None = None
    reserved_fuel: int | None = None

    def validate(self) -> None:
        for name in COUNTERS:
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_COUNTER:
                msg = f"ceilings.{name} must be between 0 and {MAX_COUNTER}, got {value}"
                raise Malformed(msg)

    def check(self, usage: Usage) -> None:
        """Raise ``BudgetExceeded`` naming every counter that ``usage`` would take past its ceiling."""
        over = [
            f"{name} {getattr(usage, name)} > {ceiling}"
            for name in COUNTERS
            if (ceiling := getattr(self, name)) is not None and getattr(usage, name) > ceiling
        ]
        if over:
            raise BudgetExceeded("budget exceeded: " + ", ".join(over))


class Price(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What one model charges, in micro-units of the run's currency per million tokens.

    Integers throughout (``cost_micros`` is a counter): $3 per million input tokens is
    ``input_per_mtok=3_000_000``. A fraction of a micro-unit is rounded up, so a run is never
    charged less than it spent.
    """

    input_per_mtok: int = 0
    output_per_mtok: int = 0

    def cost_micros(self, input_tokens: int, output_tokens: int) -> int:
        if min(self.input_per_mtok, self.output_per_mtok, input_tokens, output_tokens) < 0:
            raise Malformed("prices and token counts cannot be negative")
        total = input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok
        return -(-total // 1_000_000)
