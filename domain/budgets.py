"""Budget ceilings and cumulative usage with checked integer arithmetic.

Counters are non-negative integers bounded by the SQL ``bigint`` range, so a value that fits the
domain always fits every store; usage only ever grows (nothing is refunded).
"""

from __future__ import annotations

import msgspec

from baton.domain.errors import BudgetExceeded, CounterOverflow, Malformed

__all__ = ["COUNTERS", "MAX_COUNTER", "Ceilings", "Usage", "checked_add"]

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
        """Checked addition of every counter (plain additions, then one range check: hot path).

        The check spells out its comparisons: ``min`` and ``max`` parse keyword arguments on every
        call, which costs more than the additions. ``decide`` checks the very sum that ``apply``
        then records, so the last sum is remembered (by identity: the operands are immutable).
        """
        last = _last_sum[0]
        if last[0] is self and last[1] is other:
            return last[2]
        total = Usage(
            self.calls + other.calls,
            self.argument_bytes + other.argument_bytes,
            self.result_bytes + other.result_bytes,
            self.fuel + other.fuel,
            self.cost_micros + other.cost_micros,
            self.iterations + other.iterations,
            self.stages + other.stages,
            self.reserved_fuel + other.reserved_fuel,
        )
        b, t, top = msgspec.structs.astuple(other), msgspec.structs.astuple(total), MAX_COUNTER
        if (  # any counter added is negative, or any total is past the top
            b[0] < 0 or b[1] < 0 or b[2] < 0 or b[3] < 0 or b[4] < 0 or b[5] < 0 or b[6] < 0 or b[7] < 0
            or t[0] > top or t[1] > top or t[2] > top or t[3] > top
            or t[4] > top or t[5] > top or t[6] > top or t[7] > top
        ):  # fmt: skip
            for name in COUNTERS:  # slow path: name the counter, with the same errors as checked_add
                checked_add(getattr(self, name), getattr(other, name), what=name)
        _last_sum[0] = (self, other, total)  # one store of one tuple: a reader never sees half an entry
        return total

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
        if self == _UNBOUNDED:  # the common case, compared in C
            return
        over = [
            f"{name} {getattr(usage, name)} > {ceiling}"
            for name in COUNTERS
            if (ceiling := getattr(self, name)) is not None and getattr(usage, name) > ceiling
        ]
        if over:
            raise BudgetExceeded("budget exceeded: " + ", ".join(over))


_UNBOUNDED = Ceilings()
_last_sum: list[tuple[Usage, Usage, Usage]] = [(Usage(), Usage(), Usage())]
