"""Liveness sessions on PostgreSQL: one dedicated connection per worker, judged by ``pg_stat_activity``.

A worker's reader ledger keeps one connection open for the worker's life; its token is
``pg:<postmaster start>:<backend pid>:<backend start>`` (times in microseconds since the epoch).
When the worker's process dies, its kernel closes the socket and the server ends that backend at
once, so the session is gone within milliseconds of a SIGKILL. The session is judged alive while
a backend with that pid and start time is in ``pg_stat_activity``.

Everything uncertain counts as alive, so the lease then lasts its ttl: a token from another server
(a read replica, or this one before a restart: the postmaster start differs), a backend whose start
time this role may not read (another role's session without ``pg_read_all_stats``), a malformed
token. Only "this server, and no such backend" is gone, and that never becomes untrue.

The connection asks the server not to end it for idleness (``idle_session_timeout``) and to probe
it with TCP keepalives: a host that vanished without closing its socket (power loss, a partition)
is noticed after about ``KEEPALIVE_IDLE_S + KEEPALIVE_INTERVAL_S * KEEPALIVE_COUNT`` seconds,
longer than the default ttl, so a partition alone never ends a lease before its ttl would
(docs/operations.md, "Lease liveness"). Keepalives do not apply over a unix socket.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
from eventsourcing.persistence import OperationalError

__all__ = ["PG_PREFIX", "PostgresSession", "session_alive"]

PG_PREFIX = "pg:"
KEEPALIVE_IDLE_S = 30
KEEPALIVE_INTERVAL_S = 10
KEEPALIVE_COUNT = 3
_SETTINGS = {  # set only where the server knows them (``idle_session_timeout`` is PostgreSQL 14+)
    "idle_session_timeout": "0",
    "tcp_keepalives_idle": str(KEEPALIVE_IDLE_S),
    "tcp_keepalives_interval": str(KEEPALIVE_INTERVAL_S),
    "tcp_keepalives_count": str(KEEPALIVE_COUNT),
}
_CONFIGURE = (
    "SELECT set_config(name, value, false) FROM (SELECT unnest(%s::text[]) AS name, unnest(%s::text[]) AS value) s "
    "WHERE name IN (SELECT name FROM pg_settings)"
)
_MICROS = "(extract(epoch FROM {0}) * 1000000)::bigint"
_OWN_TOKEN = (
    f"SELECT {_MICROS.format('pg_postmaster_start_time()')} AS postmaster, pid, {_MICROS.format('backend_start')} AS "
    "started FROM pg_stat_activity WHERE pid = pg_backend_pid()"
)
_BACKEND = (
    f"SELECT {_MICROS.format('pg_postmaster_start_time()')} AS postmaster, "
    f"(SELECT {_MICROS.format('backend_start')} FROM pg_stat_activity WHERE pid = %s) AS started, "
    "EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = %s) AS present"
)


class PostgresSession:
    """The dedicated connection whose backend is this process's liveness session, opened on first use."""

    def __init__(self, pool: Any, *, name: str = "baton-liveness") -> None:
        """``pool``: the library's connection pool, whose settings (and password function) it reuses;
        ``name``: the connection's ``application_name``, what an operator sees in ``pg_stat_activity``."""
        self._pool = pool
        self._name = name
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._token = ""
        self._held: set[str] = set()

    def token(self) -> str:
        """The session's token; a connection found broken is replaced (with a new token)."""
        with self._lock:
            if self._conn is not None and not self._usable(self._conn):
                self._conn.close()
                self._conn = None
            if self._conn is None:
                self._conn, self._token = self._open()
                self._held.clear()  # a session's advisory locks end with it
            return self._token

    def hold(self, key: str) -> bool:
        """Whether this session holds the session-level advisory lock named ``key``, taking it if free.

        Checked with a round trip every call: True means the session was alive just now, so no other
        session held the lock at that moment. A connection found broken lost the lock; a new one
        tries to take it again.
        """
        self.token()
        with self._lock:
            conn = self._conn
            if conn is None:  # pragma: no cover - ``token`` opened it
                return False
            if key in self._held:
                return True  # ``token`` just proved the session alive
            try:
                row = conn.execute("SELECT pg_try_advisory_lock(hashtext(%s)) AS taken", (key,)).fetchone()
            except psycopg.Error as exc:
                raise OperationalError(str(exc)) from exc
            taken = bool(row is not None and _values(row, ("taken",))[0])
            if taken:
                self._held.add(key)
            return taken

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
                self._held.clear()

    def _open(self) -> tuple[psycopg.Connection[Any], str]:
        pool = self._pool
        kwargs = dict((pool.kwargs() if callable(pool.kwargs) else pool.kwargs) or {})
        if pool.get_password_func is not None:
            kwargs["password"] = pool.get_password_func()
        conninfo = pool.conninfo() if callable(pool.conninfo) else pool.conninfo
        kwargs |= {
            "autocommit": True,
            "connect_timeout": 5,
            "application_name": self._name,
            # the client's side of the keepalives: a worker cut off from the server notices too
            "keepalives": 1,
            "keepalives_idle": KEEPALIVE_IDLE_S,
            "keepalives_interval": KEEPALIVE_INTERVAL_S,
            "keepalives_count": KEEPALIVE_COUNT,
        }
        try:
            conn = psycopg.connect(conninfo, **kwargs)
        except psycopg.OperationalError as exc:
            raise OperationalError(str(exc)) from exc
        try:
            conn.execute(_CONFIGURE, (list(_SETTINGS), list(_SETTINGS.values())))
            row = conn.execute(_OWN_TOKEN).fetchone()
        except psycopg.Error as exc:
            conn.close()
            raise OperationalError(str(exc)) from exc
        if row is None:  # pragma: no cover - a backend always sees itself
            conn.close()
            raise OperationalError("the session's backend is missing from pg_stat_activity")
        postmaster, pid, started = _values(row, ("postmaster", "pid", "started"))
        return conn, f"{PG_PREFIX}{postmaster}:{pid}:{started}"

    @staticmethod
    def _usable(conn: psycopg.Connection[Any]) -> bool:
        if conn.closed or conn.broken:
            return False
        try:
            conn.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True


def session_alive(conn: psycopg.Connection[Any], token: str) -> bool:
    """Whether the session ``token`` names may still be open: False only when this server proves it ended."""
    parts = token.removeprefix(PG_PREFIX).split(":")
    if not token.startswith(PG_PREFIX) or len(parts) != 3 or not all(p.isdigit() for p in parts):
        return True  # not a token this module made: unknown, so alive
    postmaster, pid, started = (int(p) for p in parts)
    row = conn.execute(_BACKEND, (pid, pid)).fetchone()
    if row is None:  # pragma: no cover - a SELECT without FROM returns its row
        return True
    now_postmaster, now_started, present = _values(row, ("postmaster", "started", "present"))
    if now_postmaster != postmaster:
        return True  # another server, or this one restarted: cannot tell from here
    if not present:
        return False
    return now_started is None or now_started == started  # None: this role may not read it


def _values(row: Any, names: tuple[str, ...]) -> tuple[Any, ...]:
    """Columns by name whether the connection makes dict rows (the library's) or tuples."""
    return tuple(row[name] for name in names) if isinstance(row, dict) else tuple(row)
