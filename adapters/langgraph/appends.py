"""Appends to LangGraph threads under this worker's lease, folded into the thread index in log order.

Each append first records the thread's pending index fold (the previous append's events) with its
own blobs in one statement, or, from an event loop on PostgreSQL, in the append's transaction (as
*riders*). The fold's compare-and-set (``baton_lg_threads.position = expected``) only lands if folds
are recorded in log order, and LangGraph writes one thread from several places at once (a sync
graph puts from its thread pool, an async one from concurrent tasks). So every append of a thread,
from taking its pending fold to keeping its own, runs under that thread's lock; an event loop's
tasks queue on an ``asyncio.Lock`` first, so that one of them at most waits for the thread lock
(and then in a worker thread).

Lease events hold nothing for the index: the saver folds them along (empty folds), and after a
takeover it catches the index up, since the events of the worker before are not its to fold.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import threading
import uuid
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec

from baton.adapters.eventstore import RunLedger
from baton.adapters.eventstore.blobs import BlobStore
from baton.adapters.eventstore.fenced import Riders
from baton.adapters.identity import SigningKey
from baton.adapters.langgraph.index import ThreadIndex
from baton.domain import errors
from baton.domain.commands import (
    AcquireLease,
    Command,
    OpenRun,
    PutCheckpoint,
    PutWrites,
    ReleaseLease,
    RenewLease,
    Submission,
    Verdict,
)
from baton.domain.events import BlobRef, CheckpointRecorded, Event, Placement, WritesRecorded

__all__ = ["ThreadWriter"]

log = logging.getLogger("baton.langgraph")

SCHEMA_NAME = "langgraph.checkpoint"
_TASK_REF = BlobRef("sha256:" + "0" * 64, 0, "langgraph:thread")
_REJECTIONS: dict[str, type[errors.BatonError]] = {
    cls.reason: cls for cls in errors.Rejection.__subclasses__() if "__init__" not in vars(cls)
} | {errors.ConcurrencyConflict.reason: errors.ConcurrencyConflict}


class _Lease(msgspec.Struct):
    epoch: int
    expires_at: int


class _Fold(NamedTuple):
    """An index update not yet written: ``events`` move the thread's index from ``expected`` to ``upto``."""

    expected: int
    upto: int
    events: builtins.list[tuple[int, Event]]
    docs: dict[str, bytes]


class ThreadWriter:
    """This worker's leases on threads, its appends to them, and their index folds."""

    def __init__(
        self, ledger: RunLedger, index: ThreadIndex, *, worker: str, ttl_ms: int, key: SigningKey | None
    ) -> None:
        self.ledger = ledger
        self.index = index
        self.worker = worker
        self.ttl_ms = ttl_ms
        self.key = key
        self._leases: dict[str, _Lease] = {}
        self._stale: dict[str, int] = {}  # threads this saver lost: the epoch that moved on
        # the index fold of each thread's last append, recorded with its next append (or before a read)
        self._pending: dict[str, _Fold] = {}
        self._locks: dict[str, threading.RLock] = {}  # per thread: its appends and folds, one at a time
        # per event loop and thread: an asyncio.Lock binds to the loop that first waits on it
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def submission(self, run_id: str, command: Command, epoch: int) -> Submission:
        submission = Submission("lg-" + uuid.uuid4().hex, run_id, self.worker, command, epoch)
        return self.key.sign(submission) if self.key is not None else submission

    def release(self, run_id: str) -> None:
        with self.ordered(run_id):
            held = self._leases.pop(run_id, None)
            if held is not None:
                verdict = self.ledger.submit(self.submission(run_id, ReleaseLease(), held.epoch))
                if verdict.position is not None:  # the release holds nothing for the index
                    self._defer(run_id, _Fold(verdict.position - 1, verdict.position, [], {}))

    def release_all(self) -> None:
        for run_id in list(self._leases):
            self.release(run_id)

    def forget(self, run_id: str) -> None:
        self._stale.pop(run_id, None)
        self._leases.pop(run_id, None)

    # -- appends ------------------------------------------------------------------------------

    def append(
        self,
        run_id: str,
        commands: Sequence[Command],
        blobs: dict[str, bytes] | None = None,
        *,
        fold: bool = False,
        first: Submission | None = None,
    ) -> builtins.list[Verdict]:
        """Append under this saver's lease (taken or renewed first, in the same transaction when it can).

        The thread's pending index fold and the blobs the commands reference go first, in one
        statement of their own, so that the append is the store's one-statement append (in PostgreSQL
        that is faster than riding in it, which takes the library's transaction: bench/supersteps.py).
        A blob whose event never commits is a harmless orphan. With ``fold``, the events of the
        checkpoints and writes appended become the thread's pending fold (their documents are in
        ``blobs``); other appends are caught up by the caller (``sync``). ``first``: the submission of
        ``commands`` tried already (``aappend``).
        """
        blobs = blobs or {}
        with self.ordered(run_id):
            with self._lock:
                pending = self._pending.pop(run_id, None)
            if pending is not None:
                self._record_or_keep(run_id, pending, blobs)
            elif blobs:
                self.index.blobs.put(blobs)
            verdicts = self._submit(run_id, commands, first)
            if fold:
                self._keep(run_id, commands, verdicts, blobs)
            return verdicts

    async def aappend(
        self, run_id: str, commands: Sequence[Command], blobs: dict[str, bytes], *, fold: bool = False
    ) -> builtins.list[Verdict]:
        """``append`` from the event loop: one awaited transaction when the lease needs no command, the
        blobs and the pending fold riding in it (``_riders``).

        Otherwise, or when the thread's lock is held in another thread, or when the ledger declines
        (``RunLedger.asubmit``), ``append`` runs in a thread with the same submission, so a try that
        did commit is answered ``duplicate``, never appended twice.
        """
        async with self._queue(run_id):
            lock = self.ordered(run_id)
            epoch = self._held(run_id)
            if epoch is None or len(commands) != 1 or self.ledger.async_appends is None or not lock.acquire(False):
                return await asyncio.to_thread(self.append, run_id, commands, blobs, fold=fold)
            try:  # never held across a hop to a thread: the thread takes the lock itself
                riders, riding = self._riders(run_id, blobs)  # pure CPU on PostgreSQL: the folds ride
                first = self.submission(run_id, commands[0], epoch)
                try:
                    verdict = await self.ledger.asubmit(first, riders=riders)
                except BaseException:
                    self._put_back(run_id, riding)
                    raise
                if verdict is None:
                    self._put_back(run_id, riding)
                elif fold:
                    self._keep(run_id, commands, [verdict], blobs)
            finally:
                lock.release()
            if verdict is not None:
                return [verdict]
            return await asyncio.to_thread(self.append, run_id, commands, blobs, fold=fold, first=first)

    def _submit(self, run_id: str, commands: Sequence[Command], first: Submission | None) -> builtins.list[Verdict]:
        for attempt in range(2):
            epoch, lease = self._lease(run_id)
            if first is not None and attempt == 0 and first.epoch != epoch:
                # The lease moved since the first try: that try may still have committed (a lost reply),
                # and a new submission would append the same checkpoint again.
                recorded = self.ledger.recorder.select_submission(first.submission_id)  # type: ignore[attr-defined]
                if recorded is not None:
                    return [Verdict(first.submission_id, "duplicate", run_id, position=recorded.position)]
            ours = (
                [first]
                if first is not None and attempt == 0 and first.epoch == epoch
                else [self.submission(run_id, c, epoch) for c in commands]
            )
            submissions = [*(self.submission(run_id, c, epoch) for c in lease), *ours]
            if len(submissions) == 1:
                verdicts = [self.ledger.submit(submissions[0])]
            else:
                verdicts = self.ledger.submit_many(submissions)
            rejected = next((v for v in verdicts if v.verdict == "rejected"), None)
            if rejected is None:
                if lease:
                    self._leases[run_id] = _Lease(epoch, self.ledger.clock.now() + self.ttl_ms * 1000)
                    if len(lease) == 1 and isinstance(lease[0], RenewLease):  # one event, nothing for the index
                        renewed = _position(verdicts[0])
                        self._defer(run_id, _Fold(renewed - 1, renewed, [], {}))
                return verdicts[len(lease) :]
            if rejected.reason == "lease_expired" and attempt == 0 and run_id in self._leases:
                self._leases[run_id].expires_at = 0  # judged expired by the store's clock: take it again
                continue
            if rejected.reason == "stale_epoch":
                self._leases.pop(run_id, None)
                self._stale[run_id] = rejected.current_epoch or 0
            raise _error(rejected)
        raise AssertionError("unreachable")  # pragma: no cover

    # -- the lease ----------------------------------------------------------------------------

    def _held(self, run_id: str) -> int | None:
        """The epoch of this saver's lease on the thread when an append needs no lease command (no I/O)."""
        held = self._leases.get(run_id)
        if held is None or run_id in self._stale:
            return None
        return held.epoch if held.expires_at - self.ledger.clock.now() >= self.ttl_ms * 500 else None

    def _lease(self, run_id: str) -> tuple[int, builtins.list[Command]]:
        """The epoch to append under, and the lease commands that must go first (under the thread's lock)."""
        if run_id in self._stale:
            msg = (
                f"{self.worker!r} lost thread {run_id!r} to epoch {self._stale[run_id]}; call forget() to take it again"
            )
            raise errors.StaleEpoch(msg, current_epoch=self._stale[run_id])
        now = self.ledger.clock.now()
        held = self._leases.get(run_id)
        if held is not None and now < held.expires_at:
            renew = held.expires_at - now < self.ttl_ms * 500  # less than half the ttl left
            return held.epoch, [RenewLease(self.ttl_ms)] if renew else []
        return self._take(run_id, held, now)

    def _take(self, run_id: str, held: _Lease | None, now: int) -> tuple[int, builtins.list[Command]]:
        state = self.ledger.state(run_id)
        if held is not None and state.epoch != held.epoch:
            self._leases.pop(run_id, None)
            self._stale[run_id] = state.epoch
            msg = (
                f"{self.worker!r} held thread {run_id!r} at epoch {held.epoch}; epoch {state.epoch} is "
                f"held by {state.holder!r}: this saver is stale and will not fork the thread"
            )
            raise errors.StaleEpoch(msg, current_epoch=state.epoch)
        if state.lease is not None and state.lease.worker == self.worker and now < state.lease.expires_at:
            # ours already: a restarted saver of this worker, whose last fold may have been lost
            self._catch_up(run_id)
            return state.epoch, [RenewLease(self.ttl_ms)]
        acquire = AcquireLease(Placement(self.worker), self.ttl_ms)
        steps: builtins.list[Command] = (
            [acquire] if state.opened else [OpenRun("langgraph", SCHEMA_NAME, 1, _TASK_REF), acquire]
        )
        verdicts = self.ledger.submit_many([self.submission(run_id, c, 0) for c in steps])
        for verdict in verdicts:
            if verdict.verdict == "rejected" and verdict.reason != "run_exists":
                raise _error(verdict)
        if len(verdicts) == 2 and verdicts[0].verdict == verdicts[1].verdict == "accepted":
            opened, granted = _position(verdicts[0]), _position(verdicts[1])
            if opened == granted - 1:  # positions 1..granted are ours and hold nothing for the index
                self._defer(run_id, _Fold(0, granted, [], {}))
        else:  # taken over (or back): the events before may be another holder's to fold, or lost in a crash
            self._catch_up(run_id)
        state = self.ledger.state(run_id)
        if state.lease is None or state.lease.worker != self.worker:  # pragma: no cover - a lost race
            raise errors.LeaseHeld(f"thread {run_id!r} is held by {state.holder!r}")
        self._leases[run_id] = _Lease(state.epoch, state.lease.expires_at)
        return state.epoch, []

    # -- the index folds ----------------------------------------------------------------------

    def flush(self, run_id: str | None = None) -> None:
        """Record pending index folds (one thread's, or all) before reading the index."""
        with self._lock:
            threads = [run_id] if run_id is not None else builtins.list(self._pending)
        for thread in threads:
            with self.ordered(thread):
                with self._lock:
                    fold = self._pending.pop(thread, None)
                if fold is not None:
                    self._record_or_keep(thread, fold)

    def sync(self, run_id: str) -> None:
        """Bring the thread's index to the log's head: the pending fold, then what the log has beyond."""
        with self.ordered(run_id):
            self.flush(run_id)
            self._catch_up(run_id)

    def _catch_up(self, run_id: str) -> None:
        self.index.catch_up(run_id, lambda after: self.ledger.history(run_id, after=after))

    def _record(self, run_id: str, fold: _Fold, blobs: dict[str, bytes] | None = None) -> None:
        """Record ``fold``. If its compare-and-set misses, another process may have folded these events
        (a reader's catch-up); if the index lags instead (a fold was lost), say so and fold from the
        log, so that the thread's next folds land again."""
        if self.index.record(run_id, fold.expected, fold.events, fold.docs, blobs=blobs, upto=fold.upto):
            return
        position = self.index.position(run_id)
        if position < fold.expected:
            log.warning(
                "thread %r: the index is at %d, behind this saver's fold of %d..%d; catching it up from the log",
                run_id,
                position,
                fold.expected + 1,
                fold.upto,
            )
        if position < fold.upto:
            self._catch_up(run_id)

    def _record_or_keep(self, run_id: str, fold: _Fold, blobs: dict[str, bytes] | None = None) -> None:
        """``_record`` a fold taken from pending; if that raises (a store error), the fold is pending again.

        Dropped, it would be lost: the thread's next fold would then miss its compare-and-set, and the
        index stay behind until a catch-up from the log."""
        try:
            self._record(run_id, fold, blobs)
        except BaseException:
            self._put_back(run_id, fold)
            raise

    def _keep(
        self, run_id: str, commands: Sequence[Command], verdicts: Sequence[Verdict], blobs: dict[str, bytes]
    ) -> None:
        """Make the events of these checkpoints and writes the thread's pending fold (under its lock)."""
        events: builtins.list[tuple[int, Event]] = []
        docs: dict[str, bytes] = {}
        for c, v in zip(commands, verdicts, strict=True):
            if isinstance(c, PutCheckpoint):
                events.append(
                    (
                        _position(v),
                        CheckpointRecorded(
                            c.checkpoint_ns, c.checkpoint_id, c.document, c.parent_checkpoint_id, c.run_tag
                        ),
                    )
                )
                docs[c.document.digest] = blobs[c.document.digest]
            elif isinstance(c, PutWrites):
                events.append(
                    (_position(v), WritesRecorded(c.checkpoint_ns, c.checkpoint_id, c.task_id, c.writes, c.task_path))
                )
        if events:
            self._defer(run_id, _Fold(events[0][0] - 1, events[-1][0], events, docs))

    def _defer(self, run_id: str, fold: _Fold) -> None:
        """Keep ``fold`` for the thread's next append, joined onto the pending one when it continues it.

        One that does not continue it (the log moved on without this saver) is recorded first.
        """
        with self._lock:
            before = self._pending.get(run_id)
            if before is not None and before.upto == fold.expected:
                fold = _Fold(before.expected, fold.upto, [*before.events, *fold.events], before.docs | fold.docs)
                before = None
            self._pending[run_id] = fold
        if before is not None:
            self._record(run_id, before)

    def _riders(self, run_id: str, blobs: dict[str, bytes]) -> tuple[Riders | None, _Fold | None]:
        """What rides in an asyncio append's transaction (PostgreSQL): the blobs and the thread's pending
        fold; and that fold, to put back if the append does not commit. A fold of hiding events,
        which takes several statements, is recorded here instead."""
        with self._lock:
            pending = self._pending.pop(run_id, None)
        ctes: builtins.list[str] = []
        params: builtins.list[Any] = []
        if pending is not None:
            clauses = self.index.fold_clauses(run_id, pending.expected, pending.events, pending.docs, upto=pending.upto)
            if clauses is None:
                self._record(run_id, pending)
                pending = None
            else:
                ctes, params = clauses
        if blobs:
            clause, extra = BlobStore.insert_clause(blobs, "lg_blobs")
            ctes, params = [*ctes, clause], [*params, *extra]
        return ((", ".join(ctes), params) if ctes else None), pending

    def _put_back(self, run_id: str, fold: _Fold | None) -> None:
        """Make a fold whose append failed pending again, before any kept since."""
        if fold is not None:
            with self._lock:
                after = self._pending.pop(run_id, None)
                self._pending[run_id] = fold
            if after is not None:
                self._defer(run_id, after)

    def ordered(self, run_id: str) -> threading.RLock:
        """The thread's lock: held, its folds are taken, recorded and kept in log order."""
        lock = self._locks.get(run_id)
        return lock if lock is not None else self._locks.setdefault(run_id, threading.RLock())

    def _queue(self, run_id: str) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        with self._lock:
            return self._queues.setdefault(loop, {}).setdefault(run_id, asyncio.Lock())


def _position(verdict: Verdict) -> int:
    assert verdict.position is not None, "an accepted verdict carries its position"
    return verdict.position


def _error(verdict: Verdict) -> errors.BatonError:
    message = verdict.message or verdict.reason or "rejected"
    if verdict.reason == "stale_epoch":
        return errors.StaleEpoch(message, current_epoch=verdict.current_epoch or 0)
    return _REJECTIONS.get(verdict.reason or "", errors.Rejection)(message)
