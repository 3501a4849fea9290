"""The views in PostgreSQL: a tracking recorder whose batches write view rows in the same transaction.

Built on eventsourcing's ``PostgresTrackingRecorder`` (single-row tracking table
``batonviews_tracking``, ``max_tracking_id``, ``wait``). Each batch transaction first locks the
view set's tracking row and checks it is where the batch was read from; a runner that lost a race,
or that read before a rebuild was swapped in, gets ``StaleBatch`` and changes nothing. Then the
fold states, ``run_state`` and ``budget_usage`` rows are written and the tracking row advances
(the library's own guarded upsert), all committed together.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from eventsourcing.persistence import InterfaceError, OperationalError, Tracking
from eventsourcing.postgres import PostgresDatastore, PostgresTrackingRecorder
from eventsourcing.utils import retry
from psycopg.sql import SQL, Composed, Identifier

from baton.adapters.views.rows import ViewBatch, run_state_params
from baton.adapters.views.tables import StaleBatch, ViewTables
from baton.domain.budgets import COUNTERS
from baton.domain.events import RecordedEvent
from baton.projections.budget_usage import DIMENSIONS

__all__ = ["PostgresViews"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_COUNTER_COLUMNS = ", ".join(f"{name} bigint NOT NULL CHECK ({name} >= 0)" for name in COUNTERS)
_DIMENSIONS = ", ".join(f"'{name}'" for name in DIMENSIONS)


def _timestamp(micros: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=micros)


class PostgresViews(PostgresTrackingRecorder):
    def __init__(self, datastore: PostgresDatastore, *, tracking_table_name: str = "notification_tracking") -> None:
        super().__init__(datastore, tracking_table_name=tracking_table_name)
        if not datastore.single_row_tracking:
            raise ValueError("the views need single-row tracking (SINGLE_ROW_TRACKING must not be off)")
        self.sql_create_statements += self._ddl(ViewTables.live(""))
        self._statements: dict[ViewTables, dict[str, Composed]] = {}

    # -- schema ------------------------------------------------------------------------------

    def _names(self, tables: ViewTables) -> dict[str, Identifier]:
        return {
            "schema": Identifier(self.datastore.schema),
            "tracking": Identifier(self.tracking_table_name),
            "run_state": Identifier(tables.run_state),
            "budget_usage": Identifier(tables.budget_usage),
            "run_fold": Identifier(tables.run_fold),
        }

    def _ddl(self, tables: ViewTables) -> list[Composed]:
        names = self._names(tables)
        return [
            SQL(
                "CREATE TABLE IF NOT EXISTS {schema}.{run_state} (run_id text PRIMARY KEY, position bigint NOT NULL, "
                "stage text NOT NULL, status text NOT NULL, epoch bigint NOT NULL, owner text, "
                "resumability_class text NOT NULL, updated_at timestamptz NOT NULL)"
            ).format(**names),
            SQL(
                "CREATE TABLE IF NOT EXISTS {schema}.{budget_usage} (dimension text NOT NULL CHECK (dimension IN ("
                + _DIMENSIONS
                + ")), key text NOT NULL, "
                + _COUNTER_COLUMNS
                + ", PRIMARY KEY (dimension, key))"
            ).format(**names),
            SQL(
                "CREATE TABLE IF NOT EXISTS {schema}.{run_fold} (run_id text PRIMARY KEY, position bigint NOT NULL, "
                "state bytea NOT NULL)"
            ).format(**names),
        ]

    def _sql(self, tables: ViewTables) -> dict[str, Composed]:
        cached = self._statements.get(tables)
        if cached is not None:
            return cached
        names = self._names(tables)
        counters = SQL(", ").join(Identifier(name) for name in COUNTERS)
        added = SQL(", ").join(
            SQL("{0} = {1}.{2}.{0} + EXCLUDED.{0}").format(Identifier(name), names["schema"], names["budget_usage"])
            for name in COUNTERS
        )
        statements = {
            "lock": SQL("SELECT notification_id FROM {schema}.{tracking} WHERE application_name = %s FOR UPDATE"),
            "ensure": SQL("INSERT INTO {schema}.{tracking} VALUES (%s, 0) ON CONFLICT (application_name) DO NOTHING"),
            "load": SQL("SELECT run_id, state FROM {schema}.{run_fold} WHERE run_id = ANY(%s)"),
            "fold": SQL(
                "INSERT INTO {schema}.{run_fold} VALUES (%s, %s, %s) ON CONFLICT (run_id) DO UPDATE "
                "SET position = EXCLUDED.position, state = EXCLUDED.state"
            ),
            "run_state": SQL(
                "INSERT INTO {schema}.{run_state} VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (run_id) "
                "DO UPDATE SET position = EXCLUDED.position, stage = EXCLUDED.stage, status = EXCLUDED.status, "
                "epoch = EXCLUDED.epoch, owner = EXCLUDED.owner, resumability_class = EXCLUDED.resumability_class, "
                "updated_at = EXCLUDED.updated_at"
            ),
            "budget": SQL(
                "INSERT INTO {schema}.{budget_usage} (dimension, key, {counters}) VALUES (%s, %s{values}) "
                "ON CONFLICT (dimension, key) DO UPDATE SET {added}"
            ),
        }
        extra = {"counters": counters, "added": added, "values": SQL(", %s" * len(COUNTERS))}
        formatted = {key: statement.format(**names, **extra) for key, statement in statements.items()}
        self._statements[tables] = formatted
        return formatted

    # -- the ViewStore contract ----------------------------------------------------------------

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def position(self, tables: ViewTables) -> int:
        """The tracking id; a missing row is created at 0 so that every batch has a row to lock."""
        found = self.max_tracking_id(tables.tracking_name)
        if found is None:
            with self.datastore.transaction(commit=True) as curs:
                curs.execute(self._sql(tables)["ensure"], (tables.tracking_name,))
            found = self.max_tracking_id(tables.tracking_name)
        return found or 0

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def apply_batch(self, tables: ViewTables, after: int, events: Sequence[tuple[int, RecordedEvent]]) -> None:
        """One transaction: lock and check tracking, fold, write rows, advance tracking.

        Retried on a lost connection: if the lost commit had succeeded, the retry finds tracking
        moved and raises ``StaleBatch``, so a batch never lands twice.
        """
        if not events:
            return
        sql = self._sql(tables)
        with self.datastore.transaction(commit=True) as curs:
            curs.execute(sql["lock"], (tables.tracking_name,))
            tracked = curs.fetchone()
            if tracked is None or tracked["notification_id"] != after:
                at = None if tracked is None else tracked["notification_id"]
                raise StaleBatch(f"{tables.tracking_name}: tracking is at {at}, the batch was read after {after}")
            runs = sorted({event.run_id for _, event in events})
            curs.execute(sql["load"], (runs,))
            stored = {row["run_id"]: bytes(row["state"]) for row in curs.fetchall()}
            batch = ViewBatch(stored).apply_all(event for _, event in events)
            curs.executemany(sql["fold"], batch.states())
            curs.executemany(sql["run_state"], [run_state_params(row, _timestamp) for row in batch.run_rows()])
            budget = [(row.dimension, row.key, *row.counters()) for row in batch.budget_rows()]
            if budget:
                curs.executemany(sql["budget"], budget)
            self._insert_tracking(curs, Tracking(tables.tracking_name, events[-1][0]))

    def reset(self, tables: ViewTables) -> None:
        """Lock the set's tracking row first (the order batches use), then recreate the tables empty."""
        names, sql = self._names(tables), self._sql(tables)
        with self.datastore.transaction(commit=True) as curs:
            curs.execute(sql["ensure"], (tables.tracking_name,))
            curs.execute(sql["lock"], (tables.tracking_name,))
            curs.execute(
                SQL("DROP TABLE IF EXISTS {schema}.{run_state}, {schema}.{budget_usage}, {schema}.{run_fold}").format(
                    **names
                )
            )
            for statement in self._ddl(tables):
                curs.execute(statement)
            curs.execute(
                SQL("UPDATE {schema}.{tracking} SET notification_id = 0 WHERE application_name = %s").format(**names),
                (tables.tracking_name,),
            )

    def swap(self, build: ViewTables, live: ViewTables) -> None:
        """Drop the live tables, rename the build set into their place, move the tracking row.

        Both tracking rows are locked first, in name order: a live batch locks its row before it
        touches a table, so a batch and a swap queue on the row instead of deadlocking.
        """
        names = self._names(live)
        with self.datastore.transaction(commit=True) as curs:
            curs.execute(
                SQL(
                    "SELECT application_name FROM {schema}.{tracking} WHERE application_name = ANY(%s) "
                    "ORDER BY application_name FOR UPDATE"
                ).format(**names),
                ([build.tracking_name, live.tracking_name],),
            )
            if build.tracking_name not in {row["application_name"] for row in curs.fetchall()}:
                raise StaleBatch(f"no rebuild to swap in: tracking row {build.tracking_name!r} is missing")
            curs.execute(
                SQL("DROP TABLE IF EXISTS {schema}.{run_state}, {schema}.{budget_usage}, {schema}.{run_fold}").format(
                    **names
                )
            )
            for old, new in zip(build.tables, live.tables, strict=True):
                curs.execute(
                    SQL("ALTER TABLE {0}.{1} RENAME TO {2}").format(names["schema"], Identifier(old), Identifier(new))
                )
                # keep index names canonical, so the next rebuild's "<table>__next_pkey" is free
                curs.execute(
                    SQL("ALTER INDEX IF EXISTS {0}.{1} RENAME TO {2}").format(
                        names["schema"], Identifier(f"{old}_pkey"), Identifier(f"{new}_pkey")
                    )
                )
            curs.execute(
                SQL("DELETE FROM {schema}.{tracking} WHERE application_name = %s").format(**names),
                (live.tracking_name,),
            )
            curs.execute(
                SQL("UPDATE {schema}.{tracking} SET application_name = %s WHERE application_name = %s").format(**names),
                (live.tracking_name, build.tracking_name),
            )

    def counts(self, tables: ViewTables) -> dict[str, int]:
        schema = Identifier(self.datastore.schema)
        found: dict[str, int] = {}
        with self.datastore.transaction(commit=False) as curs:
            for key, table in zip(("run_state", "budget_usage", "view_run_fold"), tables.tables, strict=True):
                curs.execute(SQL("SELECT count(*) AS n FROM {0}.{1}").format(schema, Identifier(table)))
                row = curs.fetchone()
                found[key] = row["n"] if row is not None else 0
        return found

    def close(self) -> None:
        self.datastore.close()
