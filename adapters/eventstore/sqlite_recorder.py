"""The SQLite recorder with the fence in the append transaction.

SQLite has a single writer: an append opens with ``BEGIN IMMEDIATE``, which takes the write lock
before anything is read, and its first statement is the run row's compare-and-set UPDATE, so the
check and the insert see the same database and a concurrent writer waits (busy timeout) instead
of interleaving. (An in-memory database appends through the library's pool, whose ``BEGIN``
leaves the lock to that UPDATE, the transaction's first statement.)
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

from eventsourcing.persistence import InterfaceError, StoredEvent
from eventsourcing.sqlite import (
    SQLITE3_DEFAULT_LOCK_TIMEOUT,
    SQLiteApplicationRecorder,
    SQLiteConnection,
    SQLiteConnectionPool,
    SQLiteCursor,
    SQLiteDatastore,
)

from baton.adapters.eventstore.fenced import (
    AppendConflict,
    DuplicateSubmission,
    FenceViolation,
    RunRow,
    SubmissionRow,
    library_error_class,
    sorted_fences,
)
from baton.adapters.eventstore.sqlite_checkpoints import WalCheckpointer
from baton.domain.fencing import Fence

__all__ = ["FencedSQLiteRecorder"]


_STATEMENT_CACHE = 128  # sqlite3's default


class _StatementCachingPool(SQLiteConnectionPool):
    """eventsourcing 9.5.6's pool, with connections that keep their prepared statements.

    The library opens connections with ``cached_statements=True``, which ``sqlite3`` reads as a
    cache of *one* statement, so every append prepared its BEGIN, fence UPDATE and two INSERTs
    afresh, three of them while holding the write lock. ``_create_connection`` is the library's,
    but for the cache size.
    """

    def _create_connection(self) -> SQLiteConnection:
        return SQLiteConnection(sqlite_conn=self.connect(), max_age=self.max_age)

    def connect(self) -> sqlite3.Connection:
        """A new connection to the file, as the library makes them but for the statement cache."""
        try:
            c = sqlite3.connect(
                database=self.db_name,
                uri=True,
                check_same_thread=False,
                isolation_level=None,  # autocommit: the library's transactions issue BEGIN
                cached_statements=_STATEMENT_CACHE,
                timeout=self.lock_timeout or SQLITE3_DEFAULT_LOCK_TIMEOUT,
            )
        except (sqlite3.Error, TypeError) as e:
            raise InterfaceError(e) from e
        if not self.is_sqlite_memory_mode and not self.is_journal_mode_wal:
            cursor = c.cursor()
            cursor.execute("PRAGMA journal_mode;")
            if cursor.fetchone()[0].lower() != "wal":
                cursor.execute("PRAGMA journal_mode=WAL;")
                self.journal_mode_was_changed_to_wal = True
            self.is_journal_mode_wal = True
        c.row_factory = sqlite3.Row
        return c

    checkpointer: WalCheckpointer | None = None
    appends: _AppendConnection | None = None

    def close(self) -> None:
        if self.appends is not None:
            self.appends.close()
        if self.checkpointer is not None:
            self.checkpointer.close()
        super().close()


class _AppendConnection:
    """The one connection this process appends on, kept outside the library's pool.

    Through the pool, an append took its semaphore, its writer lock and its condition, and four
    context managers around one transaction: about a tenth of a single append's CPU. SQLite has
    one writer per file anyway, so a lock here serialises this process's appends as the pool's
    writer lock did; reads still go through the pool.
    """

    def __init__(self, pool: _StatementCachingPool) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None
        self._closed = False

    def run(self, append: Callable[[SQLiteCursor], Any]) -> Any:
        """``append`` in one ``BEGIN IMMEDIATE`` transaction: committed if it returns, rolled back if it raises.

        SQLite's errors are raised as the library's (``OperationalError`` and the rest), as its own
        transactions raise them; any other error (a fence violation) is raised as it is.
        """
        with self._lock:
            if self._closed:
                raise InterfaceError("the store is closed")
            connection = self._connection
            if connection is None:
                connection = self._connection = self._pool.connect()
            try:
                cursor = connection.cursor()
                try:
                    cursor.execute("BEGIN IMMEDIATE")
                    result = append(SQLiteCursor(cursor))
                    connection.commit()
                finally:
                    cursor.close()
            except BaseException as exc:
                self._roll_back(connection)
                if isinstance(exc, sqlite3.Error):
                    raise library_error_class(exc, sqlite3)(exc) from exc
                raise
            return result

    def _roll_back(self, connection: sqlite3.Connection) -> None:
        """Roll back whatever is open; a connection that cannot is dropped, and the next append opens another."""
        try:
            if connection.in_transaction:
                connection.rollback()
        except sqlite3.Error:
            self._connection = None
            connection.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._connection is not None:
                self._connection.close()
                self._connection = None


_INSERT_SUBMISSION = "INSERT INTO baton_submissions VALUES (?,?,?,?)"
_ROWS_PER_STATEMENT = 200  # of 4 columns: 800 parameters, under the 999 that SQLite builds before 3.32 allow


def _insert_rows(
    cursor: sqlite3.Cursor, insert: str, rows: Sequence[tuple[Any, ...]]
) -> tuple[int, sqlite3.IntegrityError] | None:
    """Run ``insert`` (``... VALUES (?,?,?,?)``) for every row; on a constraint, the first row refused.

    Full chunks of ``_ROWS_PER_STATEMENT`` rows go in as one multi-row statement each, the rest with
    ``executemany`` (a statement per row): for a 1000-event batch that took a fifth less time to write
    (bench/append.py). Only the full-chunk text is prepared, so the statement cache gains one statement
    per table, not one per batch size. A refused multi-row statement stores none of its rows; running
    its chunk row by row then names the first row refused, in order, as ``executemany`` alone would.
    The rows before it may be in: the caller's transaction is rolled back.
    """
    full = len(rows) - len(rows) % _ROWS_PER_STATEMENT
    if full:
        chunk_insert = insert + ("," + insert[insert.rindex("(") :]) * (_ROWS_PER_STATEMENT - 1)
        for start in range(0, full, _ROWS_PER_STATEMENT):
            chunk = rows[start : start + _ROWS_PER_STATEMENT]
            try:
                cursor.execute(chunk_insert, [value for row in chunk for value in row])
            except sqlite3.IntegrityError:
                refused = _insert_each(cursor, insert, rows, start, start + _ROWS_PER_STATEMENT)
                if refused is not None:
                    return refused
    return _insert_each(cursor, insert, rows, full, len(rows))


def _insert_each(
    cursor: sqlite3.Cursor, insert: str, rows: Sequence[tuple[Any, ...]], start: int, stop: int
) -> tuple[int, sqlite3.IntegrityError] | None:
    if start >= stop:
        return None
    inserted = cursor.connection.total_changes
    try:
        cursor.executemany(insert, rows[start:stop])
    except sqlite3.IntegrityError as exc:
        # the rows before it went in (clamped: a trigger's own changes would count too)
        return min(start + cursor.connection.total_changes - inserted, stop - 1), exc
    return None


class FencedSQLiteRecorder(SQLiteApplicationRecorder):
    def __init__(self, datastore: SQLiteDatastore, events_table_name: str = "stored_events") -> None:
        pool = datastore.pool
        if type(pool) is SQLiteConnectionPool:
            pool.__class__ = _StatementCachingPool  # same state; new connections cache statements
        self._checkpointer: WalCheckpointer | None = None
        self._appends: _AppendConnection | None = None
        if isinstance(pool, _StatementCachingPool) and not pool.is_sqlite_memory_mode:
            self._checkpointer = pool.checkpointer = WalCheckpointer(pool.db_name)
            self._appends = pool.appends = _AppendConnection(pool)
        super().__init__(datastore, events_table_name)

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        if self._appends is None:  # an in-memory database: the library's pool interlocks its readers and writer
            notification_ids = super().insert_events(stored_events, **kwargs)
        else:
            notification_ids = self._appends.run(lambda c: self._insert_events(c, stored_events, **kwargs))
        if self._checkpointer is not None:
            self._checkpointer.written()
        return notification_ids

    def construct_create_table_statements(self) -> list[str]:
        events = self.events_table_name
        return [
            *super().construct_create_table_statements(),
            "CREATE TABLE IF NOT EXISTS baton_runs (run_id TEXT PRIMARY KEY, head INTEGER NOT NULL, "
            "head_digest TEXT NOT NULL, "
            "epoch INTEGER NOT NULL, holder TEXT, expires_at INTEGER, stage TEXT NOT NULL, status TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS baton_submissions (submission_id TEXT PRIMARY KEY, "
            "run_id TEXT NOT NULL, content_digest TEXT NOT NULL, position INTEGER NOT NULL)",
            *(
                f"CREATE TRIGGER IF NOT EXISTS {table}_no_{verb.lower()} BEFORE {verb} ON {table} "
                f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
                for table in (events, "baton_submissions")
                for verb in ("UPDATE", "DELETE")
            ),
        ]

    def _insert_events(
        self,
        c: SQLiteCursor,
        stored_events: Sequence[StoredEvent],
        *,
        fences: Sequence[Fence] = (),
        submissions: Sequence[SubmissionRow] = (),
        **kwargs: Any,
    ) -> Sequence[int] | None:
        """Fence, then insert the submission rows and the events, each with one ``executemany``.

        Returns no notification ids: the ledger does not use them, and without them the library
        builds no per-event ``Recording``; readers get ids from ``select_notifications``.
        """
        for fence in sorted_fences(fences):
            self._apply_fence(c, fence)
        cursor: sqlite3.Cursor = c.sqlite_cursor
        refused = _insert_rows(
            cursor,
            _INSERT_SUBMISSION,
            [(row.submission_id, row.run_id, row.content_digest, row.position) for row in submissions],
        )
        if refused is not None:
            raise DuplicateSubmission(submissions[refused[0]].submission_id)
        refused = _insert_rows(
            cursor,
            self.insert_events_statement,
            [
                (
                    s.originator_id.hex if isinstance(s.originator_id, UUID) else s.originator_id,
                    s.originator_version,
                    s.topic,
                    s.state,
                )
                for s in stored_events
            ],
        )
        if refused is not None:
            raise AppendConflict(str(refused[1]))
        return None

    @staticmethod
    def _apply_fence(c: SQLiteCursor, f: Fence) -> None:
        new = (f.new_head, f.new_head_digest, f.new_epoch, f.new_holder, f.new_expires_at, f.stage, f.status)
        if f.expected_head == 0:
            try:
                c.execute("INSERT INTO baton_runs VALUES (?,?,?,?,?,?,?,?)", (f.run_id, *new))
            except sqlite3.IntegrityError:
                raise AppendConflict(f"run {f.run_id!r} was opened concurrently") from None
            return
        c.execute(
            "UPDATE baton_runs SET head=?, head_digest=?, epoch=?, holder=?, expires_at=?, stage=?, status=? "
            "WHERE run_id=? AND head=? AND head_digest=? AND epoch=? AND holder IS ? RETURNING head",
            (*new, f.run_id, f.expected_head, f.expected_head_digest, f.expected_epoch, f.expected_holder),
        )
        if c.fetchone() is not None:
            return
        c.execute("SELECT head, epoch, holder FROM baton_runs WHERE run_id=?", (f.run_id,))
        current = c.fetchone()
        if current is None:
            raise AppendConflict(f"run {f.run_id!r} has no run row")
        raise FenceViolation(f.run_id, current["head"], current["epoch"], current["holder"])

    def select_runs(self) -> list[RunRow]:
        with self.datastore.transaction(commit=False) as c:
            c.execute("SELECT * FROM baton_runs ORDER BY run_id")
            return [RunRow(**dict(row)) for row in c.fetchall()]

    def select_run(self, run_id: str) -> RunRow | None:
        with self.datastore.transaction(commit=False) as c:
            c.execute("SELECT * FROM baton_runs WHERE run_id=?", (run_id,))
            row = c.fetchone()
        return RunRow(**dict(row)) if row is not None else None

    def select_submission(self, submission_id: str) -> SubmissionRow | None:
        with self.datastore.transaction(commit=False) as c:
            c.execute("SELECT * FROM baton_submissions WHERE submission_id=?", (submission_id,))
            row = c.fetchone()
        return SubmissionRow(**dict(row)) if row is not None else None
