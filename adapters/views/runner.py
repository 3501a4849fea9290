"""The view runner: poll the event log after the tracking position and apply it in batches.

No LISTEN/NOTIFY (Baton's PostgreSQL recorder sends none, and the library's subscription does not
reconnect): the runner polls ``all_events(after=position)``, which only ever returns notification
ids that are final (below ``pg_snapshot_xmin`` in PostgreSQL; SQLite has one writer), in id order.
Each batch commits with its tracking row, so a restart simply resumes from the tracking position.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from baton.adapters.views.tables import StaleBatch, ViewStore, ViewTables
from baton.domain.events import RecordedEvent

__all__ = ["DEFAULT_BATCH", "CatchUp", "EventSource", "Progress", "StopSignal", "ViewRunner"]

DEFAULT_BATCH = 5000  # events per transaction: fewer commits (each an fsync) per event, bounded memory

Progress = Callable[[int], None]  # called with the number of events folded so far


class EventSource(Protocol):
    """The global log: every event after a notification id, in notification-id order."""

    def all_events(self, *, after: int = 0, page: int = 1000) -> Iterator[tuple[int, RecordedEvent]]: ...


class StopSignal(Protocol):
    """``threading.Event`` or ``multiprocessing.Event``."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


@dataclass
class CatchUp:
    """What one catch-up did: events and batches applied, stale batches re-read, where it ended."""

    events: int = 0
    batches: int = 0
    stale: int = 0
    position: int = 0
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def then(self, later: CatchUp) -> CatchUp:
        """Both catch-ups together, ending where ``later`` ended."""
        return CatchUp(
            self.events + later.events,
            self.batches + later.batches,
            self.stale + later.stale,
            later.position,
            self.seconds + later.seconds,
        )


class ViewRunner:
    def __init__(
        self,
        store: ViewStore,
        source: EventSource,
        *,
        upstream: str,
        batch_size: int = DEFAULT_BATCH,
        total: Callable[[], int] | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be positive")
        self.store = store
        self.source = source
        self.live = ViewTables.live(upstream)
        self.next = ViewTables.rebuild(upstream)
        self.batch_size = batch_size
        self._total = total
        self._on_close = on_close

    def total_events(self) -> int | None:
        """How many events the log holds (for a progress bar), when the wiring can tell."""
        return self._total() if self._total is not None else None

    def position(self) -> int:
        return self.store.position(self.live)

    def counts(self) -> dict[str, int]:
        """Rows per live view table."""
        return self.store.counts(self.live)

    def catch_up(self, *, progress: Progress | None = None) -> CatchUp:
        """Apply every event after the live tracking position, batch by batch, until the log is drained."""
        return self._catch_up(self.live, progress)

    def follow(self, stop: StopSignal, *, interval: float = 0.5, progress: Progress | None = None) -> CatchUp:
        """Catch up, then poll every ``interval`` seconds until ``stop`` is set; then a last catch-up."""
        total = CatchUp()
        while True:
            stopping = stop.is_set()
            total = total.then(self._catch_up(self.live, progress))
            if stopping:
                return total
            stop.wait(interval)

    def rebuild(self, *, progress: Progress | None = None) -> CatchUp:
        """Fold the whole log into fresh ``__next`` tables, swap them in atomically, then catch up.

        Readers see the old views until the swap commits and the new ones after; never a
        half-built table. The live views stay usable (and may keep being updated) meanwhile.
        """
        self.store.reset(self.next)
        built = self._catch_up(self.next, progress)
        self.store.swap(self.next, self.live)
        return built.then(self._catch_up(self.live, None))

    def _catch_up(self, tables: ViewTables, progress: Progress | None) -> CatchUp:
        started = time.perf_counter()
        result = CatchUp(position=self.store.position(tables))
        while True:
            batch = list(
                itertools.islice(self.source.all_events(after=result.position, page=self.batch_size), self.batch_size)
            )
            if not batch:
                break
            try:
                self.store.apply_batch(tables, result.position, batch)
            except StaleBatch:
                # another runner (or a swap) moved the tracking row: continue from where it is now
                result.stale += 1
                result.position = self.store.position(tables)
                continue
            result.position = batch[-1][0]
            result.events += len(batch)
            result.batches += 1
            if progress is not None:
                progress(result.events)
            if len(batch) < self.batch_size:
                break
        result.seconds = time.perf_counter() - started
        return result

    def close(self) -> None:
        self.store.close()
        if self._on_close is not None:
            self._on_close()

    def __enter__(self) -> ViewRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
