"""The run ledger: an eventsourcing application whose only verb that writes is *submit*.

A thin shell over three parts, each in its own module: the write path (``write_path``: decide,
seal and append with the fence), the reads (``reads``: history, snapshots, the global log) and
the state cache (``state_cache``). The store is reached only through the ``FencedRecorder`` port.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Generator, Iterator, Sequence
from typing import ClassVar

from eventsourcing.application import Application
from eventsourcing.persistence import InterfaceError, Mapper, OperationalError, StoredEvent

from baton.adapters.clock import Clock, SystemClock
from baton.adapters.eventstore.fenced import Riders, RunRow
from baton.adapters.eventstore.mapper import MsgspecMapper
from baton.adapters.eventstore.ports import AsyncAppender, FencedRecorder
from baton.adapters.eventstore.reads import SNAPSHOT_EVERY, LedgerReads
from baton.adapters.eventstore.state_cache import StateCache, working_copy
from baton.adapters.eventstore.store_identity import StoreIdentity
from baton.adapters.eventstore.write_path import WritePath, submission_digest
from baton.domain import errors
from baton.domain.chain import ChainReport
from baton.domain.commands import OpenRegistry, Submission, Verdict
from baton.domain.events import RecordedEvent
from baton.domain.state import RunState
from baton.projections.portable_state import PortableStateFold
from baton.projections.replay import PrefixOutline, ReplayCursor, ReplayStep

__all__ = ["SNAPSHOT_EVERY", "RunLedger", "submission_digest"]


class RunLedger(Application[str]):
    name = "BatonLedger"
    env: ClassVar[dict[str, str]] = {"ORIGINATOR_ID_TYPE": "text"}

    def __init__(self, env: dict[str, str] | None = None, *, clock: Clock | None = None) -> None:
        """A ledger that fails to build closes what it opened: the library's PostgreSQL pool opens as
        the recorders are built, and a half-built ledger is closed by nobody. When a one-shot pool's
        short wait ran out under load (``bootstrap.first_contact`` then builds another), the
        connection still being made stayed open on the server for as long as the pool lived."""
        try:
            super().__init__(env)
            store = self.recorder
            if not isinstance(store, FencedRecorder):
                msg = f"the ledger needs a fenced recorder (APPLICATION_RECORDER_TOPIC), not {type(store).__name__}"
                raise TypeError(msg)
            self.store: FencedRecorder = store
            self.snapshot_recorder = self.factory.aggregate_recorder(purpose="snapshots")
        except BaseException:
            factory = getattr(self, "factory", None)
            if factory is not None:
                factory.close()
            raise
        self.clock: Clock = clock or SystemClock()
        self._cache = StateCache()
        self._reads = LedgerReads(store, self.snapshot_recorder)
        self._writes = WritePath(store, self._cache, self.clock)

    def construct_mapper(self) -> Mapper[str]:
        return MsgspecMapper(transcoder=self.factory.transcoder())

    # -- reading -----------------------------------------------------------------------------

    def stored(
        self, run_id: str, *, after: int = 0, upto: int | None = None, limit: int | None = None
    ) -> Sequence[StoredEvent]:
        return self._reads.stored(run_id, after=after, upto=upto, limit=limit)

    def history(
        self, run_id: str, *, after: int = 0, upto: int | None = None, page: int = 1000
    ) -> Generator[RecordedEvent, None, None]:
        """A run's events in position order, a page at a time, so memory stays flat."""
        return self._reads.history(run_id, after=after, upto=upto, page=page)

    def resume_fold(self, run_id: str, *, snapshots: bool = True) -> PortableStateFold:
        """Everything a resume needs: the latest snapshot that chains onto the log, plus the events after it."""
        return self._reads.resume_fold(run_id, snapshots=snapshots)

    def replay_steps(self, run_id: str, outline: PrefixOutline) -> Iterator[ReplayStep]:
        """The settled steps of a run's replay prefix, streamed from the log."""
        return self._reads.replay_steps(run_id, outline)

    def replay_cursor(self, run_id: str, outline: PrefixOutline) -> ReplayCursor:
        """A cursor over the run's replay prefix that holds one step at a time."""
        return self._reads.replay_cursor(run_id, outline)

    def all_events(self, *, after: int = 0, page: int = 1000) -> Iterator[tuple[int, RecordedEvent]]:
        """Every event of every run in the global (notification) order, with its notification id."""
        return self._reads.all_events(after=after, page=page)

    def verify(self, run_id: str) -> ChainReport:
        """Verify the run's hash chain and anchor it to the run row; raises ``ChainBroken``."""
        return self._reads.verify(run_id)

    def runs(self) -> list[RunRow]:
        return self._reads.runs()

    def state(self, run_id: str) -> RunState:
        """The run's current state: a private copy the caller may keep."""
        with self._cache.locked([run_id]):
            return working_copy(self._writes.current(run_id))

    def blobs(self, digests: Collection[str]) -> dict[str, bytes]:
        """The blobs stored under ``digests`` (those the store has), unchecked: the caller checks each
        against the event that names it (``domain.generation_zero.migrated_state``)."""
        try:
            return self.store.select_blobs(digests)
        except (OperationalError, InterfaceError) as exc:
            raise errors.StoreUnavailable(f"store unavailable: {exc}") from exc

    # -- the store's identity -----------------------------------------------------------------

    def identity(self) -> StoreIdentity:
        """The store's identity (``baton store id``): it signs claim receipts and keys snapshot tags."""
        found = self.store.select_store_identity()
        if found is None:
            raise errors.BatonError("this store has lost its identity: its baton_store row is missing")
        return found

    # -- liveness ----------------------------------------------------------------------------

    def session(self) -> str:
        """This process's liveness session with the store, kept open until ``close`` ("" where the store
        has none): a worker declares it when it acquires a lease, so that the lease can be taken over
        early once the store sees the session end (docs/operations.md, "Lease liveness")."""
        try:
            return self.store.session()
        except (OperationalError, InterfaceError) as exc:
            raise errors.StoreUnavailable(f"store unavailable: {exc}") from exc

    def session_alive(self, token: str) -> bool:
        """Whether the store sees the session ``token`` still open (a token it cannot judge: True)."""
        try:
            return self.store.session_alive(token)
        except (OperationalError, InterfaceError) as exc:
            raise errors.StoreUnavailable(f"store unavailable: {exc}") from exc

    def relay_leader(self) -> bool:
        """Whether this process is the store's one event relay now, taking the role if it is free: one
        ``baton serve`` publishes to Kafka at a time (docs/operations.md, "Event relay on Kafka")."""
        try:
            return self.store.hold_relay()
        except (OperationalError, InterfaceError) as exc:
            raise errors.StoreUnavailable(f"store unavailable: {exc}") from exc

    @property
    def lease_takeovers(self) -> int:
        """Leases this process's appends ended by force (ttl passed, or the holder's session gone)."""
        return self._writes.lease_takeovers

    # -- writing -----------------------------------------------------------------------------

    def submit(self, submission: Submission) -> Verdict:
        """Decide and append one submission: a verdict, or ``StoreUnavailable``; never a half-write."""
        if isinstance(submission.command, OpenRegistry):
            return _genesis_refused(submission)
        return self._writes.submit(submission)

    def submit_many(self, submissions: Sequence[Submission]) -> list[Verdict]:
        """Submit a batch in one transaction when every submission is accepted, else each on its own."""
        if any(isinstance(s.command, OpenRegistry) for s in submissions):
            return [self.submit(s) for s in submissions]
        return self._writes.submit_many(submissions)

    def open_registry(self, submission: Submission) -> Verdict:
        """Open the store's principal registry (``bootstrap.init_store`` does, for an operator).

        Not through ``submit``: on a store without a registry, whoever opened it would become its
        operator, so the wire never can.
        """
        return self._writes.submit(submission)

    async def asubmit(self, submission: Submission, *, riders: Riders | None = None) -> Verdict | None:
        """Submit from an event loop without blocking it: the verdict when it is accepted at once, else None.

        None whenever that would need more than CPU and one awaited append (no async store, no
        cached state, the run busy in another thread, a rejection, a lost race, a store error).
        Then call ``submit`` with the same submission in a thread: it decides again from the store
        and answers ``duplicate`` if this try did commit.
        """
        appender = self.async_appends
        if isinstance(submission.command, OpenRegistry):
            return _genesis_refused(submission)
        if appender is None:
            return None
        return await self._writes.asubmit(appender, submission, riders=riders)

    @functools.cached_property
    def async_appends(self) -> AsyncAppender | None:
        """The store's appends from an event loop, or None where it has none (SQLite)."""
        return self.store.async_appender()

    def close(self) -> None:
        appender = self.__dict__.get("async_appends")  # only if one was made
        if appender is not None:
            appender.close()
        self.store.close()
        super().close()


def _genesis_refused(submission: Submission) -> Verdict:
    message = "the registry is opened by `baton store init`, never by a submission"
    return Verdict(
        submission.submission_id, "rejected", submission.run_id, reason=errors.Malformed.reason, message=message
    )
