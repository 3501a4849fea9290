"""The SQLite store's schema, as migrations (see ``migrations``), and the code that applies them.

Migrations run on a connection of their own in one ``BEGIN IMMEDIATE`` transaction, which takes
the file's write lock before anything is read: two concurrent ``store init`` runs take turns, and
the second finds the first one's versions recorded.

Version 2 gives the store its identity (``baton_store``: an Ed25519 key made in the migration's
transaction, see ``store_identity``) and empties the snapshot table, whose untagged rows no resume
would use again.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator

from baton.adapters.eventstore.fenced import library_error_class
from baton.adapters.eventstore.migrations import (
    VERSION_TABLE,
    Migration,
    baseline_versions,
    plan,
    require_current,
)
from baton.adapters.eventstore.store_identity import new_identity

__all__ = ["MIGRATIONS", "check_schema", "migrate"]

# An unversioned store with all of these is at the baseline; one missing any gets migration 1 run
# (every statement of which leaves what exists as it is).
_BASELINE_TABLES = {"stored_events", "stored_snapshots", "baton_runs", "baton_submissions", "baton_blobs"}
_BUSY_TIMEOUT_S = 5.0  # sqlite3's default: how long a concurrent init may keep the file locked
_INSERT_IDENTITY = "INSERT INTO baton_store (store_id, public_key, private_key) VALUES (?, ?, ?)"


def _append_only(table: str) -> tuple[str, ...]:
    return tuple(
        f"CREATE TRIGGER IF NOT EXISTS {table}_no_{verb.lower()} BEFORE {verb} ON {table} "
        f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
        for verb in ("UPDATE", "DELETE")
    )


MIGRATIONS = (
    Migration(
        0,
        "version table",
        (f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (v INTEGER PRIMARY KEY, name TEXT NOT NULL)",),
    ),
    Migration(
        1,
        "events, snapshots, run rows, submission ids, blobs; append-only triggers",
        (
            "CREATE TABLE IF NOT EXISTS stored_events (originator_id TEXT, originator_version INTEGER, "
            "topic TEXT, state BLOB, PRIMARY KEY (originator_id, originator_version))",
            "CREATE TABLE IF NOT EXISTS stored_snapshots (originator_id TEXT, originator_version INTEGER, "
            "topic TEXT, state BLOB, PRIMARY KEY (originator_id, originator_version)) WITHOUT ROWID",
            "CREATE TABLE IF NOT EXISTS baton_runs (run_id TEXT PRIMARY KEY, head INTEGER NOT NULL, "
            "head_digest TEXT NOT NULL, epoch INTEGER NOT NULL, holder TEXT, expires_at INTEGER, "
            "stage TEXT NOT NULL, status TEXT NOT NULL)",
            "CREATE TABLE IF NOT EXISTS baton_submissions (submission_id TEXT PRIMARY KEY, "
            "run_id TEXT NOT NULL, content_digest TEXT NOT NULL, position INTEGER NOT NULL)",
            "CREATE TABLE IF NOT EXISTS baton_blobs (digest TEXT PRIMARY KEY, data BLOB NOT NULL)",
            *_append_only("stored_events"),
            *_append_only("baton_submissions"),
        ),
    ),
    Migration(
        2,
        "the store's identity (baton_store, append-only); snapshots tagged with its key",
        (
            "CREATE TABLE baton_store (singleton INTEGER PRIMARY KEY DEFAULT 1 CHECK (singleton = 1), "
            "store_id TEXT NOT NULL, public_key TEXT NOT NULL, private_key BLOB NOT NULL)",
            *_append_only("baton_store"),
            "DELETE FROM stored_snapshots",  # written untagged: none would be used again
        ),
        seed=lambda: (_INSERT_IDENTITY, tuple(new_identity())),
    ),
)


def migrate(path: str) -> list[int]:
    """Apply the migrations the SQLite file at ``path`` lacks; the versions applied (or recorded)."""
    with _connect(path) as connection:
        _use_wal(connection)
        connection.execute("BEGIN IMMEDIATE")
        try:
            recorded, baseline = _version(connection)
            done: list[int] = []
            for migration in plan(MIGRATIONS, recorded, baseline_present=baseline):
                for statement in migration.statements:
                    connection.execute(statement)
                if migration.seed is not None:
                    connection.execute(*migration.seed())
                if migration.version == 0 and recorded is None and baseline:
                    done += _record(connection, baseline_versions(MIGRATIONS))  # its tables are the baseline's
                done += _record(connection, [migration])
            connection.execute("COMMIT")
        finally:
            if connection.in_transaction:
                connection.execute("ROLLBACK")
    return done


def check_schema(path: str) -> None:
    """Raise ``SchemaNotReady`` unless the file's schema is the latest; changes nothing."""
    with _connect(path) as connection:
        recorded, baseline = _version(connection)
    require_current(recorded, MIGRATIONS, baseline_present=baseline, store=f"the SQLite store {path}")


@contextlib.contextmanager
def _connect(path: str) -> Iterator[sqlite3.Connection]:
    """A connection of its own to ``path``, closed after; sqlite3's errors are raised as the library's."""
    try:
        connection = sqlite3.connect(path, uri=True, isolation_level=None, timeout=_BUSY_TIMEOUT_S)
        try:
            yield connection
        finally:
            connection.close()
    except sqlite3.Error as exc:
        raise library_error_class(exc, sqlite3)(exc) from exc


def _use_wal(connection: sqlite3.Connection) -> None:
    """Put the file in WAL mode (as the library's pool does) before the first table is made.

    Switching needs the file to itself and fails at once, without the busy timeout, while another
    connection (a concurrent init) is in a transaction: it is tried again until that timeout.
    """
    deadline = time.monotonic() + _BUSY_TIMEOUT_S
    while True:
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def _version(connection: sqlite3.Connection) -> tuple[int | None, bool]:
    """The highest recorded version (None: no version table), and whether the baseline's tables exist."""
    tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    recorded = None
    if VERSION_TABLE in tables:
        (highest,) = connection.execute(f"SELECT coalesce(max(v), -1) FROM {VERSION_TABLE}").fetchone()
        recorded = int(highest)
    return recorded, tables >= _BASELINE_TABLES


def _record(connection: sqlite3.Connection, migrations: list[Migration]) -> list[int]:
    connection.executemany(
        f"INSERT INTO {VERSION_TABLE} (v, name) VALUES (?, ?)",
        [(m.version, m.name) for m in migrations],
    )
    return [m.version for m in migrations]
