"""Cumulative budget usage, per run and rolled up by worker, model, provider and day.

A pure fold over events in any global order that keeps each run's events in position order
(the notification log does). Each event's charge is attributed to the worker that appended it,
to the model and provider of the lease in force at that moment, and to its UTC day.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Literal

from domain.budgets import Usage
from domain.events import LeaseGranted, Placement, RecordedEvent

__all__ = ["DIMENSIONS", "BudgetUsageFold", "Dimension", "budget_usage"]

Dimension = Literal["run", "worker", "model", "provider", "day"]
DIMENSIONS: tuple[Dimension, ...] = ("run", "worker", "model", "provider", "day")


class BudgetUsageFold:
    def __init__(self) -> None:
        self.placements: dict[str, Placement] = {}
        self.rows: dict[tuple[Dimension, str], Usage] = {}

    def apply(self, event: RecordedEvent) -> None:
        body = event.body
        if isinstance(body, LeaseGranted):
            self.placements[event.run_id] = body.placement
        charge: Usage | None = getattr(body, "charge", None)
        if charge is None or charge == Usage():
            return
        placement = self.placements.get(event.run_id)
        day = dt.datetime.fromtimestamp(event.recorded_at // 1_000_000, tz=dt.UTC).date().isoformat()
        keys: dict[Dimension, str] = {
            "run": event.run_id,
            "worker": event.worker,
            "model": placement.model if placement else "",
            "provider": placement.provider if placement else "",
            "day": day,
        }
        for dimension, key in keys.items():
            row = (dimension, key)
            self.rows[row] = self.rows.get(row, Usage()).plus(charge)

    def by(self, dimension: Dimension) -> dict[str, Usage]:
        return {key: usage for (dim, key), usage in sorted(self.rows.items()) if dim == dimension}


def budget_usage(events: Iterable[RecordedEvent]) -> BudgetUsageFold:
    fold = BudgetUsageFold()
    for event in events:
        fold.apply(event)
    return fold
