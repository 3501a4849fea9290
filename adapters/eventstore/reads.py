"""The ledger's reads: a run's history, resume folds over snapshots, replay prefixes, the global log.

Reads go through the recorders' library API (``select_events``, ``select_notifications``) a page at
a time, so memory stays flat however long the run. Snapshots are a cache, never evidence: one is
used only when its tag (``snapshots``) verifies with the store's key for this run, its position and
the digest the log holds there; any other is ignored, logged, and the run folded from the log.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Generator, Iterator, Sequence

import msgspec
from eventsourcing.persistence import AggregateRecorder, IntegrityError, StoredEvent

from baton.adapters.eventstore import snapshots as sealed
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
log = logging.getLogger("baton.snapshots")


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

        The events are read from the snapshot's own position: the tag must verify for the digest
        the log holds there, or the snapshot is ignored (and logged) and the run is folded from
        scratch. After folding ``SNAPSHOT_EVERY`` or more events a new snapshot is written.
        """
        latest = self._latest_snapshot(run_id) if snapshots else None
        fold: PortableStateFold | None = None
        folded = 0
        if latest is not None and (key := self._snapshot_key) is not None:
            with contextlib.closing(self.history(run_id, after=latest.originator_version - 1)) as events:
                fold = _trusted(key, run_id, latest, next(events, None))
                if fold is not None:
                    folded = _fold(fold, events)
        if fold is None:
            fold = PortableStateFold(run_id)
            with contextlib.closing(self.history(run_id)) as events:
                folded = _fold(fold, events)
        if snapshots and folded >= SNAPSHOT_EVERY and (key := self._snapshot_key) is not None:
            self._write_snapshot(key, fold)
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

    @functools.cached_property
    def _snapshot_key(self) -> bytes | None:
        """The store's snapshot key, read once, when a snapshot is first used or written (a process that
        never meets one never holds it); None (no snapshots used or written) without an identity."""
        identity = self.store.select_store_identity()
        if identity is None:
            log.warning(
                "the store's identity cannot be read (no baton_store row, or this role may not read it): "
                "resumes fold from the log, without snapshots"
            )
            return None
        return identity.snapshot_key()

    def _latest_snapshot(self, run_id: str) -> StoredEvent | None:
        latest = self.snapshots.select_events(run_id, desc=True, limit=1)
        return latest[0] if latest else None

    def _write_snapshot(self, key: bytes, fold: PortableStateFold) -> None:
        run = fold.run
        stored = sealed.seal(key, run.run_id, run.version, run.head_digest, fold.to_bytes())
        snapshot = StoredEvent(run.run_id, run.version, sealed.TOPIC, stored)
        with contextlib.suppress(IntegrityError):  # another process wrote this position's snapshot
            self.snapshots.insert_events([snapshot])


def _fold(fold: PortableStateFold, events: Iterator[RecordedEvent]) -> int:
    """Apply ``events`` to ``fold``; how many there were."""
    folded = 0
    for event in events:
        fold.apply(event)
        folded += 1
    return folded


def _trusted(key: bytes, run_id: str, row: StoredEvent, event: RecordedEvent | None) -> PortableStateFold | None:
    """The snapshot ``row`` as a fold, if this store wrote it for this run at the log's ``event``;
    else None, and a warning naming the run, the position and why."""
    found = _unsealed(key, run_id, row, event)
    if isinstance(found, str):
        log.warning(
            "snapshot of run %r at position %d ignored: %s; folding the run from its log",
            run_id,
            row.originator_version,
            found,
        )
        return None
    return found


def _unsealed(key: bytes, run_id: str, row: StoredEvent, event: RecordedEvent | None) -> PortableStateFold | str:
    """The fold a snapshot row holds, or why it is not to be used."""
    position = row.originator_version
    if event is None or event.position != position:
        return "the log has no event at its position"
    if row.topic != sealed.TOPIC:
        return f"its topic {row.topic!r} is not a snapshot this Baton writes"
    data = sealed.unseal(key, run_id, position, event.digest, row.state)
    if data is None:
        return "its tag does not verify for this run, position and log digest"
    try:
        fold = PortableStateFold.from_bytes(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return "its content does not decode"
    if (fold.run.run_id, fold.run.version, fold.run.head_digest) != (run_id, position, event.digest):
        return "its content names another run, position or digest"
    return fold
