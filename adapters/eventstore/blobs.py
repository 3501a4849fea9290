"""The content-addressed blob store: ``baton_blobs(digest PRIMARY KEY, data)`` next to the events
(a table of the store's schema, see ``migrations``).

A blob is written before the event that references it, or (PostgreSQL) in the same statement as
its append (``insert_clause``); its key is the SHA-256 of its bytes, so a blob whose event never
committed is a harmless orphan and a retry writes nothing new. A handoff's document and migrated
state are written by the append itself, in its transaction on both backends, keyed by the
domain-separated digest their event names (``domain.generation_zero``). Blobs are the
only rows Baton ever deletes, and only by an audited purge (docs/langgraph.md).

In PostgreSQL the connection commits with ``synchronous_commit = off``: the event that references a
blob commits later with a WAL flush, which also flushes the blob's earlier commit record, so no
durable event can point at a blob lost in a crash.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

from psycopg_pool import ConnectionPool

from baton.adapters.settings import StoreSettings

__all__ = ["BlobStore", "SqlConnection", "blob_digest"]

_POOL_KEYS = ("pool_size", "max_overflow")
_SCALAR_ROWS = 4  # blobs written as scalar rows in ``insert_clause``; more go as arrays


def blob_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class SqlConnection:
    """One small connection source per store, for side tables (blobs, indexes) beside the ledger.

    SQL is written with ``%s`` placeholders; ``in_list`` expands a collection for ``IN (...)``.
    """

    def __init__(self, url: str, *, pool_size: int = 4) -> None:
        self.settings = StoreSettings.resolve(url)
        self.backend = self.settings.backend
        self._lock = threading.Lock()
        self._sqlite: sqlite3.Connection | None = None
        self._pool: ConnectionPool[Any] | None = None
        if self.backend == "sqlite":
            conn = sqlite3.connect(self.settings.sqlite_path, check_same_thread=False, isolation_level=None, timeout=30)
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":  # ``store init`` switched it
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._sqlite = conn
        else:
            self._pool = ConnectionPool(
                _libpq_url(self.settings.url),
                min_size=1,
                max_size=pool_size,
                kwargs={"autocommit": True, "options": "-c synchronous_commit=off"},
                open=True,
            )

    def sql(self, text: str) -> str:
        return text.replace("%s", "?") if self.backend == "sqlite" else text

    def in_list(self, values: Collection[Any]) -> str:
        return ",".join(["%s"] * len(values)) if values else "NULL"

    @contextmanager
    def cursor(self, *, transaction: bool = False) -> Iterator[Any]:
        """A cursor; with ``transaction`` its statements commit together (or not at all).

        SQLite: the cursor is closed before the lock is released. The caller's frame keeps the
        cursor object alive past the ``with``, and a sqlite3 cursor freed with its last statement
        still set resets that statement, which the connection's statement cache shares: freed
        outside the lock, it reset another thread's ``executemany`` of the same SQL mid-way
        (``InterfaceError: bad parameter or other API misuse``).
        """
        if self._sqlite is not None:
            with self._lock:
                cur = self._sqlite.cursor()
                try:
                    if transaction:
                        cur.execute("BEGIN IMMEDIATE")
                    try:
                        yield _SqliteCursor(cur)
                    except BaseException:
                        if transaction:
                            cur.execute("ROLLBACK")
                        raise
                    if transaction:
                        cur.execute("COMMIT")
                finally:
                    cur.close()
            return
        assert self._pool is not None
        with self._pool.connection() as conn:
            if transaction:
                with conn.transaction(), conn.cursor() as cur:
                    yield cur
            else:
                with conn.cursor() as cur:
                    yield cur

    def close(self) -> None:
        if self._sqlite is not None:
            self._sqlite.close()
        if self._pool is not None:
            self._pool.close()


class _SqliteCursor:
    """A sqlite3 cursor that takes ``%s`` placeholders like psycopg's."""

    def __init__(self, cur: sqlite3.Cursor) -> None:
        self._cur = cur

    def execute(self, text: str, params: Sequence[Any] = ()) -> _SqliteCursor:
        self._cur.execute(text.replace("%s", "?"), tuple(params))
        return self

    def executemany(self, text: str, rows: Sequence[Sequence[Any]]) -> None:
        self._cur.executemany(text.replace("%s", "?"), rows)

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount


def _libpq_url(url: str) -> str:
    """The store URL without the ledger's pool options, which libpq does not know."""
    parts = urlsplit(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items() if k not in _POOL_KEYS}
    return urlunsplit(parts._replace(scheme="postgresql", query=urlencode(query)))


class BlobStore:
    """Put, get and (for purges only) delete blobs by digest."""

    def __init__(self, conn: SqlConnection) -> None:
        self.conn = conn

    def put(self, blobs: Mapping[str, bytes]) -> None:
        """Store blobs keyed by their digests; ones already stored are left as they are."""
        if not blobs:
            return
        with self.conn.cursor() as cur:
            if self.conn.backend == "sqlite":
                cur.executemany("INSERT OR IGNORE INTO baton_blobs VALUES (%s, %s)", list(blobs.items()))
            else:
                cur.execute(
                    "INSERT INTO baton_blobs SELECT * FROM unnest(%s::text[], %s::bytea[]) ON CONFLICT DO NOTHING",
                    (list(blobs), list(blobs.values())),
                )

    @staticmethod
    def insert_clause(blobs: Mapping[str, bytes], name: str) -> tuple[str, list[Any]]:
        """PostgreSQL: ``name AS (INSERT ...)`` storing ``blobs``, with its parameters, to run inside another
        statement (a fold, an append).

        A few blobs (a checkpoint's) go as scalar rows: psycopg dumps arrays in Python, element by
        element, which cost more client CPU than the rest of a put's parameters together. More go as
        binary arrays, so that the statement text (a prepared statement each) stays one of a few.
        """
        if len(blobs) <= _SCALAR_ROWS:
            rows = ", ".join(["(%s, %b)"] * len(blobs))
            return f"{name} AS (INSERT INTO baton_blobs VALUES {rows} ON CONFLICT DO NOTHING)", [
                value for item in blobs.items() for value in item
            ]
        clause = (
            f"{name} AS (INSERT INTO baton_blobs SELECT * FROM unnest(%b::text[], %b::bytea[]) ON CONFLICT DO NOTHING)"
        )
        return clause, [list(blobs), list(blobs.values())]

    def get(self, digests: Collection[str]) -> dict[str, bytes]:
        if not digests:
            return {}
        with self.conn.cursor() as cur:
            cur.execute(
                f"SELECT digest, data FROM baton_blobs WHERE digest IN ({self.conn.in_list(digests)})", list(digests)
            )
            return {digest: bytes(data) for digest, data in cur.fetchall()}

    def delete(self, digests: Collection[str]) -> int:
        """Erase blobs (``baton purge`` only, after its audit record is appended); returns how many went."""
        if not digests:
            return 0
        with self.conn.cursor() as cur:
            cur.execute(f"DELETE FROM baton_blobs WHERE digest IN ({self.conn.in_list(digests)})", list(digests))
            return max(int(cur.rowcount), 0)
