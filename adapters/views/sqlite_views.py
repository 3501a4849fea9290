"""The views in SQLite: the same contract as PostgreSQL, in the store's own file.

Built on eventsourcing's ``SQLiteTrackingRecorder`` (its ``tracking`` table). SQLite has one
writer at a time: each transaction's first statement is a write to the view set's tracking row,
which takes the database's write lock before anything is read (waiting out the busy timeout
rather than failing on a stale read snapshot), so checking the row, folding and writing all see
one state of the database.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence

from eventsourcing.persistence import Tracking
from eventsourcing.sqlite import SQLiteCursor, SQLiteDatastore, SQLiteTrackingRecorder

from baton.adapters.views.rows import ViewBatch, run_state_params
from baton.adapters.views.tables import StaleBatch, ViewTables
from baton.domain.budgets import COUNTERS
from baton.domain.events import RecordedEvent
from baton.projections.budget_usage import DIMENSIONS

__all__ = ["SQLiteViews"]

# typeof() = 'integer': SQLite turns an overflowing integer sum into a float; refuse it instead.
_COUNTER_COLUMNS = ", ".join(
    f"{name} INTEGER NOT NULL CHECK (typeof({name}) = 'integer' AND {name} >= 0)" for name in COUNTERS
)
_DIMENSIONS = ", ".join(f"'{name}'" for name in DIMENSIONS)


def iso_utc(micros: int) -> str:
    """``updated_at`` as SQLite stores it: ISO 8601 UTC with microseconds, sortable as text."""
    moment = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _ddl(tables: ViewTables) -> list[str]:
    return [
        f'CREATE TABLE IF NOT EXISTS "{tables.run_state}" (run_id TEXT PRIMARY KEY, position INTEGER NOT NULL, '
        "stage TEXT NOT NULL, status TEXT NOT NULL, epoch INTEGER NOT NULL, owner TEXT, "
        "resumability_class TEXT NOT NULL, updated_at TEXT NOT NULL) WITHOUT ROWID",
        f'CREATE TABLE IF NOT EXISTS "{tables.budget_usage}" (dimension TEXT NOT NULL CHECK (dimension IN '
        f"({_DIMENSIONS})), key TEXT NOT NULL, {_COUNTER_COLUMNS}, PRIMARY KEY (dimension, key)) WITHOUT ROWID",
        f'CREATE TABLE IF NOT EXISTS "{tables.run_fold}" (run_id TEXT PRIMARY KEY, position INTEGER NOT NULL, '
        "state BLOB NOT NULL) WITHOUT ROWID",
    ]


class SQLiteViews(SQLiteTrackingRecorder):
    def __init__(self, datastore: SQLiteDatastore) -> None:
        super().__init__(datastore)
        if not datastore.single_row_tracking:
            raise ValueError("the views need single-row tracking (SINGLE_ROW_TRACKING must not be off)")

    def construct_create_table_statements(self) -> list[str]:
        return [*super().construct_create_table_statements(), *_ddl(ViewTables.live(""))]

    @staticmethod
    def _lock(c: SQLiteCursor, tracking_name: str) -> int | None:
        """Take the write lock with the first statement and read the tracking row under it."""
        c.execute(
            "UPDATE tracking SET notification_id = notification_id WHERE application_name = ? "
            "RETURNING notification_id",
            (tracking_name,),
        )
        row = c.fetchone()
        return None if row is None else int(row[0])

    # -- the ViewStore contract ----------------------------------------------------------------

    def position(self, tables: ViewTables) -> int:
        """The tracking id; a missing row is created at 0 so that every batch has a row to lock."""
        found = self.max_tracking_id(tables.tracking_name)
        if found is None:
            with self.datastore.transaction(commit=True) as c:
                c.execute("INSERT OR IGNORE INTO tracking VALUES (?, 0)", (tables.tracking_name,))
            found = self.max_tracking_id(tables.tracking_name)
        return found or 0

    def apply_batch(self, tables: ViewTables, after: int, events: Sequence[tuple[int, RecordedEvent]]) -> None:
        if not events:
            return
        run_state, budget_usage, run_fold = (f'"{name}"' for name in tables.tables)
        with self.datastore.transaction(commit=True) as c:
            found = self._lock(c, tables.tracking_name)
            if found != after:
                raise StaleBatch(f"{tables.tracking_name}: tracking is at {found}, the batch was read after {after}")
            runs = sorted({event.run_id for _, event in events})
            c.execute(
                f"SELECT run_id, state FROM {run_fold} WHERE run_id IN (SELECT value FROM json_each(?))",
                (json.dumps(runs),),
            )
            stored = {row[0]: bytes(row[1]) for row in c.fetchall()}
            batch = ViewBatch(stored).apply_all(event for _, event in events)
            c.executemany(
                f"INSERT INTO {run_fold} VALUES (?, ?, ?) ON CONFLICT (run_id) DO UPDATE "
                "SET position = excluded.position, state = excluded.state",
                batch.states(),
            )
            c.executemany(
                f"INSERT INTO {run_state} VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO UPDATE "
                "SET position = excluded.position, stage = excluded.stage, status = excluded.status, "
                "epoch = excluded.epoch, owner = excluded.owner, resumability_class = excluded.resumability_class, "
                "updated_at = excluded.updated_at",
                [run_state_params(row, iso_utc) for row in batch.run_rows()],
            )
            added = ", ".join(f"{name} = {budget_usage}.{name} + excluded.{name}" for name in COUNTERS)
            c.executemany(
                f"INSERT INTO {budget_usage} (dimension, key, {', '.join(COUNTERS)}) "
                f"VALUES (?, ?{', ?' * len(COUNTERS)}) ON CONFLICT (dimension, key) DO UPDATE SET {added}",
                [(row.dimension, row.key, *row.counters()) for row in batch.budget_rows()],
            )
            self._insert_tracking(c, Tracking(tables.tracking_name, events[-1][0]))

    def reset(self, tables: ViewTables) -> None:
        with self.datastore.transaction(commit=True) as c:
            c.execute("INSERT OR REPLACE INTO tracking VALUES (?, 0)", (tables.tracking_name,))
            for name in tables.tables:
                c.execute(f'DROP TABLE IF EXISTS "{name}"')
            for statement in _ddl(tables):
                c.execute(statement)

    def swap(self, build: ViewTables, live: ViewTables) -> None:
        with self.datastore.transaction(commit=True) as c:
            if self._lock(c, build.tracking_name) is None:
                raise StaleBatch(f"no rebuild to swap in: tracking row {build.tracking_name!r} is missing")
            for name in live.tables:
                c.execute(f'DROP TABLE IF EXISTS "{name}"')
            for old, new in zip(build.tables, live.tables, strict=True):
                c.execute(f'ALTER TABLE "{old}" RENAME TO "{new}"')
            c.execute("DELETE FROM tracking WHERE application_name = ?", (live.tracking_name,))
            c.execute(
                "UPDATE tracking SET application_name = ? WHERE application_name = ?",
                (live.tracking_name, build.tracking_name),
            )

    def counts(self, tables: ViewTables) -> dict[str, int]:
        with self.datastore.transaction(commit=False) as c:
            found = {}
            for key, name in zip(("run_state", "budget_usage", "view_run_fold"), tables.tables, strict=True):
                c.execute(f'SELECT count(*) FROM "{name}"')
                found[key] = int(c.fetchone()[0])
        return found

    def close(self) -> None:
        self.datastore.close()
