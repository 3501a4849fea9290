"""The view tables, their names, and the contract every view store keeps.

A *view set* is three tables plus one tracking row: ``run_state``, ``budget_usage``,
``view_run_fold`` and the row of the tracking table named after the upstream application. The
live set has the plain names; a rebuild fills a second set (``__next`` suffixes, tracking row
``<upstream>__next``) and then swaps it in, tables and tracking row together, in one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from baton.domain.events import RecordedEvent

__all__ = ["REBUILD_SUFFIX", "StaleBatch", "ViewStore", "ViewTables"]

REBUILD_SUFFIX = "__next"


@dataclass(frozen=True)
class ViewTables:
    run_state: str
    budget_usage: str
    run_fold: str
    tracking_name: str  # the tracking row's application_name: whose notification ids it counts

    @classmethod
    def live(cls, upstream: str) -> ViewTables:
        return cls("run_state", "budget_usage", "view_run_fold", upstream)

    @classmethod
    def rebuild(cls, upstream: str) -> ViewTables:
        live = cls.live(upstream)
        return cls(*(name + REBUILD_SUFFIX for name in (live.run_state, live.budget_usage, live.run_fold, upstream)))

    @property
    def tables(self) -> tuple[str, str, str]:
        return (self.run_state, self.budget_usage, self.run_fold)


class StaleBatch(Exception):
    """The tracking row is not where the batch was read from (another runner, or a swap): re-read."""


class ViewStore(Protocol):
    """A database that holds view sets and applies batches to them exactly once."""

    def position(self, tables: ViewTables) -> int:
        """The last notification id folded into ``tables`` (0 before any)."""
        ...

    def apply_batch(self, tables: ViewTables, after: int, events: Sequence[tuple[int, RecordedEvent]]) -> None:
        """Fold ``events`` (ids after ``after``, in order) and advance tracking, in one transaction.

        Raises ``StaleBatch``, having changed nothing, when the tracking row is not at ``after``.
        """
        ...

    def reset(self, tables: ViewTables) -> None:
        """Drop and recreate ``tables`` empty, with tracking at 0 (the start of a rebuild)."""
        ...

    def swap(self, build: ViewTables, live: ViewTables) -> None:
        """Replace the live set by the build set, tables and tracking row, in one transaction."""
        ...

    def counts(self, tables: ViewTables) -> dict[str, int]:
        """Rows per table, for reports."""
        ...

    def close(self) -> None: ...
