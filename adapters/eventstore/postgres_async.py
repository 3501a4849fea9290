"""Fenced appends from an event loop: the PostgreSQL recorder's one statement on asyncio connections.

An ``await`` instead of a hop to a worker thread for each append (LangGraph's async checkpointer
API). The statement, its parameters and the error translation are the sync recorder's
(``FencedPostgresRecorder.append_query``), so the fence is the same compare-and-set in the same
statement: a stale writer is rejected atomically, whichever path it takes.

A connection belongs to the event loop that opened it. A few are kept per recorder; when all are
busy ``ready`` says no and the caller takes the sync path in a thread (``RunLedger.asubmit``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import psycopg
from eventsourcing.persistence import OperationalError, StoredEvent
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow, tuple_row

from baton.adapters.eventstore.fenced import Riders, SubmissionRow, fence_missed
from baton.domain.fencing import Fence

if TYPE_CHECKING:
    from baton.adapters.eventstore.postgres_recorder import FencedPostgresRecorder

__all__ = ["AsyncAppends"]


_CONNECT_TIMEOUT_S = 5  # as the sync pool waits for a connection: then the caller falls back to it


class _Slot(NamedTuple):
    loop: asyncio.AbstractEventLoop
    conn: psycopg.AsyncConnection[TupleRow]
    curs: psycopg.AsyncCursor[TupleRow]  # one per connection: a cursor costs client CPU to make


class AsyncAppends:
    """The recorder's appends on up to ``size`` asyncio connections (autocommit, like its pool's)."""

    def __init__(self, recorder: FencedPostgresRecorder, *, size: int = 4) -> None:
        self._recorder = recorder
        self._size = size
        self._lock = threading.Lock()
        self._idle: list[_Slot] = []
        self._opened = 0  # connections open, idle or in use
        self._closed = False

    def ready(self) -> bool:
        """Whether an append on the running loop can start at once (an idle connection, or room for one)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            orphans = self._drop_orphans()
            ready = not self._closed and (self._opened < self._size or any(s.loop is loop for s in self._idle))
        for orphan in orphans:
            _discard(orphan)
        return ready

    def _drop_orphans(self) -> list[_Slot]:
        """Under the lock: forget idle connections whose loops have ended (the caller discards them)."""
        orphans = [s for s in self._idle if s.loop.is_closed()]
        if orphans:
            self._idle = [s for s in self._idle if not s.loop.is_closed()]
            self._opened -= len(orphans)
        return orphans

    async def insert_events(
        self,
        stored_events: Sequence[StoredEvent],
        *,
        fences: Sequence[Fence],
        submissions: Sequence[SubmissionRow],
        riders: Riders | None = None,
    ) -> None:
        """Fence and insert in one statement, raising what the sync ``insert_events`` raises.

        No retry here: after a store error the caller submits again on the sync path, which
        retries, and answers ``duplicate`` if this statement did commit.
        """
        statement, params, checked = self._recorder.append_query(fences, submissions, stored_events, riders)
        slot = await self._acquire()
        healthy, missed, current = False, False, None
        try:
            await slot.curs.execute(statement, params, prepare=True)
            missed = checked is not None and slot.curs.rowcount != 1
            if missed:
                await slot.curs.execute(self._recorder.select_run_statement, (checked,), prepare=True)
                current = await slot.curs.fetchone()
            healthy = True
        except psycopg.Error as exc:
            healthy = slot.conn.info.transaction_status == TransactionStatus.IDLE
            raise self._recorder.library_error(exc) from exc
        finally:  # a cancelled statement leaves the connection in an unknown state: close it
            self._release(slot, keep=healthy)
        if missed and checked is not None:
            raise fence_missed(checked, current)

    async def _acquire(self) -> _Slot:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._closed:
                raise OperationalError("the asyncio appends are closed")
            if self._idle and self._idle[-1].loop is loop:  # the common case: one loop, one connection
                return self._idle.pop()
            orphans = self._drop_orphans()
            found = next((i for i, s in enumerate(self._idle) if s.loop is loop), None)
            idle = self._idle.pop(found) if found is not None else None
            if idle is None and self._opened >= self._size:
                raise OperationalError("every asyncio append connection is busy")
            if idle is None:
                self._opened += 1
        for orphan in orphans:
            _discard(orphan)
        if idle is not None:
            return idle
        try:
            pool = self._recorder.datastore.pool
            kwargs = dict((pool.kwargs() if callable(pool.kwargs) else pool.kwargs) or {})
            kwargs.pop("row_factory", None)
            conninfo = pool.conninfo() if callable(pool.conninfo) else pool.conninfo
            password = getattr(pool, "get_password_func", None)
            if password is not None:
                kwargs["password"] = password()
            kwargs.setdefault("connect_timeout", _CONNECT_TIMEOUT_S)
            conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, row_factory=tuple_row, **kwargs)
        except BaseException as exc:
            with self._lock:
                self._opened -= 1
            if isinstance(exc, psycopg.Error):
                raise OperationalError(str(exc)) from exc
            raise
        return _Slot(loop, conn, conn.cursor())

    def _release(self, slot: _Slot, *, keep: bool) -> None:
        with self._lock:
            if keep and not self._closed and not slot.loop.is_closed():
                self._idle.append(slot)
                return
            self._opened -= 1
        _discard(slot)

    def close(self) -> None:
        """Close the idle connections (of any loop); ones in use close when their append ends."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            self._opened -= len(idle)
        for slot in idle:
            _discard(slot)


def _discard(slot: _Slot) -> None:
    """Close without awaiting: the connection's loop may be gone, or be cancelling this task."""
    if not slot.conn.closed:
        slot.conn.pgconn.finish()
