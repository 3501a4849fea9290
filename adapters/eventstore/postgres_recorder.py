"""The PostgreSQL recorder: fenced appends without the library's global table lock.

The library serialises every append with ``LOCK TABLE ... EXCLUSIVE`` so that notification ids
commit in id order. Here appends to different runs proceed in parallel; only the run row is locked
(``baton_fence`` takes it ``FOR UPDATE``). Tailing stays safe because a notification id is
``(transaction id << 16) + ordinal`` and readers only see ids below the oldest transaction still in
progress (``pg_snapshot_xmin``): every id under that bound is final, so a reader never passes a row
that commits later. A long-open writing transaction delays readers; it never makes them skip.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import psycopg
from eventsourcing.persistence import IntegrityError, Notification, StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from psycopg.rows import DictRow
from psycopg.sql import SQL, Composed, Identifier

from adapters.eventstore.fenced import (
    AppendConflict,
    DuplicateSubmission,
    FenceViolation,
    RunRow,
    SubmissionRow,
    sorted_fences,
)
from domain.fencing import Fence

__all__ = ["FencedPostgresRecorder"]

_FENCE_SQLSTATE = "23F01"

_FENCE_FUNCTION = """
CREATE OR REPLACE FUNCTION {schema}.baton_fence(
    p_run text, p_head bigint, p_epoch bigint, p_holder text, p_new_head bigint, p_new_epoch bigint,
    p_new_holder text, p_expires bigint, p_stage text, p_status text) RETURNS void
LANGUAGE plpgsql AS $fence$
DECLARE cur record;
BEGIN
    IF p_head = 0 THEN
        INSERT INTO {schema}.baton_runs
        VALUES (p_run, p_new_head, p_new_epoch, p_new_holder, p_expires, p_stage, p_status);
        RETURN;
    END IF;
    SELECT head, epoch, holder INTO cur FROM {schema}.baton_runs WHERE run_id = p_run FOR UPDATE;
    IF NOT FOUND OR cur.head <> p_head OR cur.epoch <> p_epoch OR cur.holder IS DISTINCT FROM p_holder THEN
        RAISE EXCEPTION 'baton fence violated on run %', p_run USING ERRCODE = '23F01',
            DETAIL = json_build_object('head', cur.head, 'epoch', cur.epoch, 'holder', cur.holder)::text;
    END IF;
    UPDATE {schema}.baton_runs SET head = p_new_head, epoch = p_new_epoch, holder = p_new_holder,
        expires_at = p_expires, stage = p_stage, status = p_status
    WHERE run_id = p_run;
END
$fence$
"""

_REFUSE_FUNCTION = """
CREATE OR REPLACE FUNCTION {schema}.baton_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $r$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP;
END
$r$
"""


class FencedPostgresRecorder(PostgresApplicationRecorder):
    def __init__(self, datastore: PostgresDatastore, *, events_table_name: str = "stored_events") -> None:
        super().__init__(datastore, events_table_name=events_table_name)
        schema = Identifier(datastore.schema)
        table = Identifier(events_table_name)
        fmt = {"schema": schema, "table": table}
        self.sql_create_statements = [
            SQL(
                "CREATE TABLE IF NOT EXISTS {schema}.{table} (originator_id text NOT NULL, "
                "originator_version bigint NOT NULL, topic text NOT NULL, state bytea NOT NULL, "
                "notification_id bigint NOT NULL, PRIMARY KEY (originator_id, originator_version))"
            ).format(**fmt),
            SQL("CREATE UNIQUE INDEX IF NOT EXISTS {index} ON {schema}.{table} (notification_id)").format(
                index=Identifier(self.notification_id_index_name), **fmt
            ),
            SQL(
                "CREATE TABLE IF NOT EXISTS {schema}.baton_runs (run_id text PRIMARY KEY, head bigint NOT NULL, "
                "epoch bigint NOT NULL, holder text, expires_at bigint, stage text NOT NULL, status text NOT NULL)"
            ).format(**fmt),
            SQL(
                "CREATE TABLE IF NOT EXISTS {schema}.baton_submissions (submission_id text PRIMARY KEY, "
                "run_id text NOT NULL, content_digest text NOT NULL, position bigint NOT NULL)"
            ).format(**fmt),
            SQL(_FENCE_FUNCTION).format(**fmt),
            SQL(_REFUSE_FUNCTION).format(**fmt),
        ]
        for target in (table, Identifier("baton_submissions")):
            self.sql_create_statements += [
                SQL(
                    "CREATE OR REPLACE TRIGGER baton_append_only BEFORE UPDATE OR DELETE ON {schema}.{target} "
                    "FOR EACH ROW EXECUTE FUNCTION {schema}.baton_refuse_change()"
                ).format(target=target, **fmt),
                SQL(
                    "CREATE OR REPLACE TRIGGER baton_no_truncate BEFORE TRUNCATE ON {schema}.{target} "
                    "FOR EACH STATEMENT EXECUTE FUNCTION {schema}.baton_refuse_change()"
                ).format(target=target, **fmt),
            ]
        self.fence_statement = SQL("SELECT {schema}.baton_fence(%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)").format(**fmt)
        self.insert_submissions_statement = SQL("INSERT INTO {schema}.baton_submissions VALUES (%s,%s,%s,%s)").format(
            **fmt
        )
        self.insert_events_statement = SQL(
            "INSERT INTO {schema}.{table} (originator_id, originator_version, topic, state, notification_id) "
            "SELECT e.i, e.v, e.t, e.s, (pg_current_xact_id()::text::bigint << 16) + e.n "
            "FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::bytea[]) WITH ORDINALITY AS e(i, v, t, s, n) "
            "RETURNING notification_id"
        ).format(**fmt)
        self.safe_bound = SQL("(pg_snapshot_xmin(pg_current_snapshot())::text::bigint << 16)")
        self.max_notification_id_statement = (
            SQL("SELECT MAX(notification_id) FROM {schema}.{table} WHERE notification_id < ").format(**fmt)
            + self.safe_bound
        )

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        try:
            ids: Sequence[int] | None = super().insert_events(stored_events, **kwargs)
        except IntegrityError as exc:
            raise _translate(exc) from None
        return ids

    def _insert_events(
        self, curs: psycopg.Cursor[DictRow], stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> None:
        fences: Sequence[Fence] = kwargs.get("fences", ())
        for f in sorted_fences(fences):
            curs.execute(
                self.fence_statement,
                (
                    f.run_id,
                    f.expected_head,
                    f.expected_epoch,
                    f.expected_holder,
                    f.new_head,
                    f.new_epoch,
                    f.new_holder,
                    f.new_expires_at,
                    f.stage,
                    f.status,
                ),
                prepare=True,
            )
        submissions: Sequence[SubmissionRow] = kwargs.get("submissions", ())
        if submissions:
            curs.executemany(
                self.insert_submissions_statement,
                [(s.submission_id, s.run_id, s.content_digest, s.position) for s in submissions],
            )

    def _insert_stored_events(
        self, curs: psycopg.Cursor[DictRow], stored_events: Sequence[StoredEvent], **_: Any
    ) -> None:
        curs.execute(
            self.insert_events_statement,
            (
                [str(e.originator_id) for e in stored_events],
                [e.originator_version for e in stored_events],
                [e.topic for e in stored_events],
                [e.state for e in stored_events],
            ),
            prepare=True,
        )

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        conditions: list[Composed | SQL] = [SQL("notification_id < ") + self.safe_bound]
        params: list[Any] = []
        if start is not None:
            conditions.append(SQL("notification_id >= %s" if inclusive_of_start else "notification_id > %s"))
            params.append(start)
        if stop is not None:
            conditions.append(SQL("notification_id <= %s"))
            params.append(stop)
        if topics:
            conditions.append(SQL("topic = ANY(%s)"))
            params.append(list(topics))
        params.append(limit)
        statement = (
            SQL("SELECT * FROM {schema}.{table} WHERE ").format(
                schema=Identifier(self.datastore.schema), table=Identifier(self.events_table_name)
            )
            + SQL(" AND ").join(conditions)
            + SQL(" ORDER BY notification_id LIMIT %s")
        )
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            curs.execute(statement, params, prepare=True)
            return [
                Notification(
                    id=row["notification_id"],
                    originator_id=row["originator_id"],
                    originator_version=row["originator_version"],
                    topic=row["topic"],
                    state=bytes(row["state"]),
                )
                for row in curs.fetchall()
            ]

    def select_runs(self) -> list[RunRow]:
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            curs.execute(SQL("SELECT * FROM {0}.baton_runs ORDER BY run_id").format(Identifier(self.datastore.schema)))
            return [RunRow(**row) for row in curs.fetchall()]

    def select_submission(self, submission_id: str) -> SubmissionRow | None:
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            curs.execute(
                SQL("SELECT * FROM {0}.baton_submissions WHERE submission_id = %s").format(
                    Identifier(self.datastore.schema)
                ),
                (submission_id,),
                prepare=True,
            )
            row = curs.fetchone()
        return SubmissionRow(**row) if row is not None else None


def _translate(exc: IntegrityError) -> IntegrityError:
    """Turn the database's integrity errors into the fenced recorders' shared failures."""
    cause = exc.__cause__
    if not isinstance(cause, psycopg.Error) or cause.diag is None:
        return exc
    diag = cause.diag
    if cause.sqlstate == _FENCE_SQLSTATE:
        row = json.loads(diag.message_detail or "{}")
        run_id = (diag.message_primary or "").rsplit(" ", 1)[-1]
        if row.get("head") is None:
            return AppendConflict(f"run {run_id!r} has no run row")
        return FenceViolation(run_id, row["head"], row["epoch"], row["holder"])
    if diag.constraint_name == "baton_submissions_pkey":
        detail = diag.message_detail or ""
        submission_id = detail.split("=(", 1)[-1].split(")", 1)[0]
        return DuplicateSubmission(submission_id)
    return AppendConflict(str(cause))
