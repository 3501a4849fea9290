"""Fenced appends from an event loop: the PostgreSQL recorder's append statements on asyncio connections.

The library has no asyncio API, so these connections run the statements the sync recorder's
append runs (``FencedPostgresRecorder.append_statements``: the append lock, the fence, the
submission rows, ``NOTIFY`` and insert), in the same order, in one transaction: a stale
writer is refused atomically, whichever path it takes.

A connection belongs to the event loop that opened it. A few are kept; when all are busy
``ready`` says no and the caller takes the sync path in a thread (``RunLedger.asubmit``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import psycopg
from eventsourcing.persistence import OperationalError, StoredEvent
from eventsourcing.postgres import ConnectionPool
from psycopg.pq import TransactionStatus
from psycopg.types.composite import CompositeInfo, register_composite

from baton.adapters.eventstore.fenced import Riders, SubmissionRow
from baton.adapters.eventstore.postgres_append import Statement, library_error
from baton.domain.fencing import Fence

__all__ = ["AsyncAppends"]

_CONNECT_TIMEOUT_S = 5  # as the sync pool waits for a connection: then the caller falls back to it

Statements = Callable[[Sequence[StoredEvent], Sequence[Fence], Sequence[SubmissionRow], Riders | None], list[Statement]]


class _Slot(NamedTuple):
    loop: asyncio.AbstractEventLoop
    conn: psycopg.AsyncConnection[Any]


class AsyncAppends:
    """Appends on up to ``size`` asyncio connections, made with the settings of the library's pool."""

    def __init__(
        self, pool: ConnectionPool[Any], statements: Statements, event_type: CompositeInfo | None, *, size: int = 4
    ) -> None:
        self._pool = pool
        self._statements = statements
        self._event_type = event_type
        self._size = size
        self._lock = threading.Lock()
        self._idle: list[_Slot] = []
        self._opened = 0  # connections open, idle or in use
        self._closed = False

    def ready(self) -> bool:
        """Whether an append on the running loop can start at once (an idle connection, or room for one)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._drop_orphans()
            return not self._closed and (self._opened < self._size or any(s.loop is loop for s in self._idle))

    async def insert_events(
        self,
        stored_events: Sequence[StoredEvent],
        *,
        fences: Sequence[Fence],
        submissions: Sequence[SubmissionRow],
        riders: Riders | None = None,
    ) -> None:
        """Fence and insert in one transaction, raising what the sync ``insert_events`` raises.

        No retry here: after a store error the caller submits again on the sync path, which
        retries, and answers ``duplicate`` if this transaction did commit.
        """
        statements = self._statements(stored_events, fences, submissions, riders)
        slot = await self._acquire()
        healthy = False
        try:
            async with slot.conn.transaction():
                for statement, params in statements:
                    await slot.conn.execute(statement, params)
            healthy = True
        except psycopg.Error as exc:
            healthy = slot.conn.info.transaction_status == TransactionStatus.IDLE
            raise library_error(exc) from exc
        finally:  # a cancelled statement leaves the connection in an unknown state: close it
            self._release(slot, keep=healthy)

    async def _acquire(self) -> _Slot:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._closed:
                raise OperationalError("the asyncio appends are closed")
            self._drop_orphans()
            found = next((i for i, s in enumerate(self._idle) if s.loop is loop), None)
            if found is not None:
                return self._idle.pop(found)
            if self._opened >= self._size:
                raise OperationalError("every asyncio append connection is busy")
            self._opened += 1
        try:
            conn = await self._connect()
        except BaseException:
            with self._lock:
                self._opened -= 1
            raise
        return _Slot(loop, conn)

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        pool = self._pool
        kwargs = dict((pool.kwargs() if callable(pool.kwargs) else pool.kwargs) or {})
        kwargs.pop("row_factory", None)
        if pool.get_password_func is not None:
            kwargs["password"] = pool.get_password_func()
        kwargs.setdefault("connect_timeout", _CONNECT_TIMEOUT_S)
        try:
            conninfo = pool.conninfo() if callable(pool.conninfo) else pool.conninfo
            conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, **kwargs)
        except psycopg.Error as exc:
            raise OperationalError(str(exc)) from exc
        if self._event_type is not None:
            register_composite(self._event_type, conn)
        return conn

    def _drop_orphans(self) -> None:
        """Under the lock: close idle connections whose loops have ended."""
        orphans = [s for s in self._idle if s.loop.is_closed()]
        if orphans:
            self._idle = [s for s in self._idle if not s.loop.is_closed()]
            self._opened -= len(orphans)
            for orphan in orphans:
                _discard(orphan)

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
