"""Cumulative budget usage, per run and rolled up by worker, model, provider and day.

A pure fold over events in any global order that keeps each run's events in position order
(the notification log does). Each event's charge is attributed to the worker that appended it,
to the model and provider of the lease in force at that moment, and to its UTC day.

A run imported from another store opens with ``HandoffAccepted(imported=True)``, whose ``carried``
usage is what the run spent before it came here: the run's usage is carried + local (what a resume
reports), so the fold counts ``carried`` as that event's charge. An in-store acceptance carries
nothing new: its usage was charged by this very log.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Literal

from baton.domain.budgets import Usage
from baton.domain.events import Event, HandoffAccepted, LeaseGranted, Placement, RecordedEvent

__all__ = ["DIMENSIONS", "BudgetUsageFold", "Dimension", "budget_usage"]

Dimension = Literal["run", "worker", "model", "provider", "day"]
DIMENSIONS: tuple[Dimension, ...] = ("run", "worker", "model", "provider", "day")
_NOTHING = Usage()


_Attribution = tuple[str, str, str, str, str]  # run, worker, model, provider, day: DIMENSIONS' order
_DAY_US = 86_400_000_000


class BudgetUsageFold:
    """Charges summed per attribution (run, worker, model, provider, day), rolled up on demand.

    One checked addition per charged event, whatever the number of dimensions: a batch of one
    run's events touches one attribution, and ``rows`` rolls it up into five rows once.
    """

    def __init__(self) -> None:
        self.placements: dict[str, Placement] = {}
        self.attributed: dict[_Attribution, Usage] = {}

    def apply(self, event: RecordedEvent) -> None:
        body = event.body
        if isinstance(body, LeaseGranted):
            self.placements[event.run_id] = body.placement
        charge = _charge(body)
        if charge is None or charge == _NOTHING:
            return
        placement = self.placements.get(event.run_id)
        key = (
            event.run_id,
            event.worker,
            placement.model if placement else "",
            placement.provider if placement else "",
            _day(event.recorded_at),
        )
        previous = self.attributed.get(key)
        self.attributed[key] = charge if previous is None else previous.plus(charge)

    @property
    def rows(self) -> dict[tuple[Dimension, str], Usage]:
        """Usage per ``(dimension, key)`` for every dimension."""
        rows: dict[tuple[Dimension, str], Usage] = {}
        for key, usage in self.attributed.items():
            for dimension, value in zip(DIMENSIONS, key, strict=True):
                row = (dimension, value)
                previous = rows.get(row)
                rows[row] = usage if previous is None else previous.plus(usage)
        return rows

    def by(self, dimension: Dimension) -> dict[str, Usage]:
        return {key: usage for (dim, key), usage in sorted(self.rows.items()) if dim == dimension}


def _charge(body: Event) -> Usage | None:
    """What ``body`` adds to its run's usage in this store."""
    if isinstance(body, HandoffAccepted):
        return body.carried if body.imported else None
    charge: Usage | None = getattr(body, "charge", None)
    return charge


def _day(recorded_at: int) -> str:
    """The UTC date of a time in microseconds since the epoch, as ``YYYY-MM-DD``."""
    return dt.datetime.fromtimestamp(recorded_at // _DAY_US * 86_400, tz=dt.UTC).date().isoformat()


def budget_usage(events: Iterable[RecordedEvent]) -> BudgetUsageFold:
    fold = BudgetUsageFold()
    for event in events:
        fold.apply(event)
    return fold
