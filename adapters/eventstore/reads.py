"""The ledger's reads: a run's history, resume folds over snapshots, replay prefixes, the global log.

Reads go through the recorders' library API (``select_events``, ``select_notifications``) a page at
a time, so memory stays flat however long the run. Snapshots are a cache, never evidence: one is
used only when the log's next event chains onto its head digest.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterator, Sequence

from eventsourcing.persistence import AggregateRecorder, IntegrityError, StoredEvent

from baton.adapters.eventstore.fenced import RunRow
from baton.adapters.eventstore.mapper import decode_recorded
from baton.adapters.eventstore.ports import FencedRecorder
from baton.domain.chain import ChainReport, verify_chain
from baton.domain.errors import ChainBroken
from baton.domain.events import RecordedEvent
from baton.projections.portable_state import PortableStateFold
from baton.projections.replay import PrefixOutline, ReplayCursor, ReplayStep, prefix_steps

__all__ = ["PAGE", "SNAPSHOT_EVERY", "LedgerReads"]

PAGE = 1000
SNAPSHOT_EVERY = 100  # a resume never folds more than this many events past the latest snapshot
_SNAPSHOT_TOPIC = "projections.portable_state:ResumeState.v3"


class LedgerReads:
    """Reads over a fenced recorder and its snapshot recorder."""

    def __init__(self, store: FencedRecorder, snapshots: AggregateRecorder) -> None:
        self.store = store
        self.snapshots = snapshots

    def stored(
        self, run_id: str, *, after: int = 0, upto: int | None = None, limit: int | None = None
    ) -> Sequence[StoredEvent]:
        return self.store.select_events(run_id, gt=after or None, lte=upto, limit=limit)

    def history(
        self, run_id: str, *, after: int = 0, upto: int | None = None, page: int = PAGE
    ) -> Generator[RecordedEvent, None, None]:
        """A run's events in position order, fetched a page at a time."""
        while True:
            batch = self.stored(run_id, after=after, upto=upto, limit=page)
            for stored in batch:
                yield decode_recorded(stored.topic, stored.state)
            if len(batch) < page:
                return
            after = batch[-1].originator_version

    def resume_fold(self, run_id: str, *, snapshots: bool = True) -> PortableStateFold:
        """Everything a resume needs, folded from the latest snapshot plus the events after it.

        The first event after a snapshot must chain onto the snapshot's head digest, or the
        snapshot is ignored and the run is folded from scratch. After folding ``SNAPSHOT_EVERY``
        or more events a new snapshot is written.
        """
        fold = self._latest_snapshot(run_id) if snapshots else None
        if fold is None:
            fold = PortableStateFold(run_id)
        start, folded, chained = fold.run.version, 0, True
        with contextlib.closing(self.history(run_id, after=start)) as events:
            for event in events:
                if folded == 0 and start and event.prev_digest != fold.run.head_digest:
                    chained = False  # the snapshot does not chain onto the log: ignore it
                    break
                fold.apply(event)
                folded += 1
        if not chained:
            return self.resume_fold(run_id, snapshots=False)
        if snapshots and folded >= SNAPSHOT_EVERY:
            self._write_snapshot(fold)
        return fold

    def replay_steps(self, run_id: str, outline: PrefixOutline) -> Iterator[ReplayStep]:
        """The settled steps of a run's replay prefix, streamed from the log after the prefix's start."""
        with contextlib.closing(self.history(run_id, after=outline.start)) as events:
            yield from prefix_steps(events, outline.length)

    def replay_cursor(self, run_id: str, outline: PrefixOutline) -> ReplayCursor:
        """A cursor over the run's replay prefix that holds one step at a time."""
        return ReplayCursor(outline, self.replay_steps(run_id, outline))

    def all_events(self, *, after: int = 0, page: int = PAGE) -> Iterator[tuple[int, RecordedEvent]]:
        """Every event of every run in the global (notification) order, with its notification id."""
        while True:
            notifications = self.store.select_notifications(after, page, inclusive_of_start=False)
            for notification in notifications:
                yield notification.id, decode_recorded(notification.topic, notification.state)
            if len(notifications) < page:
                return
            after = notifications[-1].id

    def verify(self, run_id: str) -> ChainReport:
        """Verify the chain, then anchor it to the run row: a cut-off tail leaves a valid but short chain.

        The run row is written in the same transaction as every append, so it is an independent
        witness of the head; an auditor who also anchors head digests elsewhere closes the
        remaining gap of an attacker who rewrites both.
        """
        report = verify_chain((s.state for s in self.stored(run_id)), run_id=run_id)
        row = self.store.select_run(run_id)
        if row is not None and (report.events, report.head_digest) != (row.head, row.head_digest):
            missing = report.events + 1 if report.events < row.head else row.head
            msg = (
                f"position {missing}: the log ends at {report.events} ({report.head_digest}) but the run row "
                f"records head {row.head} ({row.head_digest})"
            )
            raise ChainBroken(msg, missing)
        return report

    def runs(self) -> list[RunRow]:
        return self.store.select_runs()

    def _latest_snapshot(self, run_id: str) -> PortableStateFold | None:
        latest = self.snapshots.select_events(run_id, desc=True, limit=1)
        if not latest or latest[0].topic != _SNAPSHOT_TOPIC:
            return None  # none yet, or written by an older build in another shape: fold from scratch
        return PortableStateFold.from_bytes(latest[0].state)

    def _write_snapshot(self, fold: PortableStateFold) -> None:
        run = fold.run
        snapshot = StoredEvent(run.run_id, run.version, _SNAPSHOT_TOPIC, fold.to_bytes())
        with contextlib.suppress(IntegrityError):  # another process wrote this position's snapshot
            self.snapshots.insert_events([snapshot])
