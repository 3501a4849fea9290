"""The SQLite recorder with the fence in the append transaction.

eventsourcing's ``SQLiteApplicationRecorder.insert_events`` runs ``_insert_events`` in one
transaction on the pool's writer connection; this recorder's ``_insert_events`` checks and updates
the run rows first, then inserts the submission rows, then the library's own insert of the events.
The transaction's first statement is the run row's compare-and-set (a write), so it takes SQLite's
single write lock before anything is read: the check and the insert see the same database, and a
concurrent writer waits (busy timeout) instead of interleaving.
"""

from __future__ import annotations

import fcntl
import sqlite3
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from eventsourcing.persistence import StoredEvent
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteCursor

from baton.adapters.eventstore import sqlite_schema
from baton.adapters.eventstore.fenced import (
    AppendConflict,
    DuplicateSubmission,
    FenceViolation,
    RunRow,
    SubmissionRow,
    sorted_fences,
)
from baton.adapters.eventstore.liveness import process_alive, process_token
from baton.adapters.eventstore.ports import AsyncAppender
from baton.adapters.eventstore.store_identity import StoreIdentity
from baton.domain.fencing import Fence

__all__ = ["FencedSQLiteRecorder"]

_INSERT_RUN = "INSERT INTO baton_runs VALUES (?,?,?,?,?,?,?,?)"
_UPDATE_RUN = (
    "UPDATE baton_runs SET head=?, head_digest=?, epoch=?, holder=?, expires_at=?, stage=?, status=? "
    "WHERE run_id=? AND head=? AND head_digest=? AND epoch=? AND holder IS ? RETURNING head"
)
_INSERT_SUBMISSION = "INSERT INTO baton_submissions VALUES (?,?,?,?)"
_INSERT_BLOB = "INSERT OR IGNORE INTO baton_blobs VALUES (?,?)"  # content-addressed: a stored one is the same


class FencedSQLiteRecorder(SQLiteApplicationRecorder):
    """The library's SQLite application recorder, with fences and submission ids in each append."""

    def construct_create_table_statements(self) -> list[str]:
        return []  # the schema is the migrations' (``sqlite_schema``)

    def create_table(self) -> None:
        """What the library calls under ``CREATE_TABLE=y``: apply the migrations."""
        self.migrate()

    def migrate(self) -> list[int]:
        return sqlite_schema.migrate(self.datastore.pool.db_name)

    def check_schema(self) -> None:
        sqlite_schema.check_schema(self.datastore.pool.db_name)

    def async_appender(self) -> AsyncAppender | None:
        return None  # appends from an event loop go through a thread

    _relay_lock: Any = None  # the open lock file while this process holds the relay lock

    def close(self) -> None:
        """Release the relay lock, if held; the application closes the library's pool."""
        held, self._relay_lock = self._relay_lock, None
        if held is not None:
            held.close()

    def hold_relay(self) -> bool:
        """An exclusive ``flock`` on ``<database>-relay.lock`` beside the file (a SQLite store is on one
        host): the kernel drops it when the process ends. An in-memory database is this process's own."""
        name = str(self.datastore.pool.db_name)
        if self._relay_lock is not None or ":memory:" in name or "mode=memory" in name:
            return True
        handle = open(f"{name.removeprefix('file:').split('?', 1)[0]}-relay.lock", "a")  # noqa: SIM115 (held open)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        self._relay_lock = handle
        return True

    def session(self) -> str:
        """The process is the session: a SQLite store is on one host (``liveness``)."""
        return process_token()

    def session_alive(self, token: str) -> bool:
        return process_alive(token)

    def _insert_events(
        self,
        c: SQLiteCursor,
        stored_events: Sequence[StoredEvent],
        *,
        fences: Sequence[Fence] = (),
        submissions: Sequence[SubmissionRow] = (),
        blobs: Mapping[str, bytes] | None = None,
        **kwargs: Any,
    ) -> Sequence[int] | None:
        """Fence every run (in run id order), then insert the submission rows, the blobs the events
        reference (``baton_blobs`` is in the same file, so in the same transaction), then the events.

        Raises ``FenceViolation``, ``AppendConflict`` or ``DuplicateSubmission``; the library's
        transaction then rolls everything back.
        """
        for fence in sorted_fences(fences):
            _apply_fence(c, fence)
        for row in submissions:
            try:
                c.execute(_INSERT_SUBMISSION, (row.submission_id, row.run_id, row.content_digest, row.position))
            except sqlite3.IntegrityError:
                raise DuplicateSubmission(row.submission_id) from None
        for digest, data in (blobs or {}).items():
            c.execute(_INSERT_BLOB, (digest, data))
        try:
            return super()._insert_events(c, stored_events, **kwargs)
        except sqlite3.IntegrityError as exc:  # a position taken concurrently
            raise AppendConflict(str(exc)) from exc

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

    def select_blobs(self, digests: Collection[str]) -> dict[str, bytes]:
        if not digests:
            return {}
        with self.datastore.transaction(commit=False) as c:
            marks = ",".join("?" * len(digests))
            c.execute(f"SELECT digest, data FROM baton_blobs WHERE digest IN ({marks})", [*digests])
            return {row[0]: bytes(row[1]) for row in c.fetchall()}

    def select_store_identity(self) -> StoreIdentity | None:
        with self.datastore.transaction(commit=False) as c:
            c.execute("SELECT store_id, public_key, private_key FROM baton_store")
            row = c.fetchone()
        return StoreIdentity(row[0], row[1], bytes(row[2])) if row is not None else None


def _apply_fence(c: SQLiteCursor, f: Fence) -> None:
    """Create the run row (a new run) or compare-and-set it; raise what the store held instead."""
    new = (f.new_head, f.new_head_digest, f.new_epoch, f.new_holder, f.new_expires_at, f.stage, f.status)
    if f.expected_head == 0:
        try:
            c.execute(_INSERT_RUN, (f.run_id, *new))
        except sqlite3.IntegrityError:
            raise AppendConflict(f"run {f.run_id!r} was opened concurrently") from None
        return
    c.execute(
        _UPDATE_RUN, (*new, f.run_id, f.expected_head, f.expected_head_digest, f.expected_epoch, f.expected_holder)
    )
    if c.fetchone() is not None:
        return
    c.execute("SELECT head, epoch, holder FROM baton_runs WHERE run_id=?", (f.run_id,))
    current = c.fetchone()
    if current is None:
        raise AppendConflict(f"run {f.run_id!r} has no run row")
    raise FenceViolation(f.run_id, current["head"], current["epoch"], current["holder"])
