"""The SQLite recorder with the fence in the append transaction.

SQLite has a single writer: the first statement of the append is the run row's compare-and-set
UPDATE, which takes the write lock before anything is read, so the check and the insert see the
same database and a concurrent writer waits (busy timeout) instead of interleaving.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
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

from adapters.eventstore.fenced import (
    AppendConflict,
    DuplicateSubmission,
    FenceViolation,
    RunRow,
    SubmissionRow,
    sorted_fences,
)
from adapters.eventstore.sqlite_checkpoints import WalCheckpointer
from domain.fencing import Fence

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
        return SQLiteConnection(sqlite_conn=c, max_age=self.max_age)

    checkpointer: WalCheckpointer | None = None

    def close(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()
        super().close()


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
        if isinstance(pool, _StatementCachingPool) and not pool.is_sqlite_memory_mode:
            self._checkpointer = pool.checkpointer = WalCheckpointer(pool.db_name)
        super().__init__(datastore, events_table_name)

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        notification_ids = super().insert_events(stored_events, **kwargs)
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
