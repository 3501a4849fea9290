"""The PostgreSQL recorder: fenced appends without the library's global table lock.

The library serialises every append with ``LOCK TABLE ... EXCLUSIVE`` so that notification ids
commit in id order. Here appends to different runs proceed in parallel; only the run row is locked
(``baton_append`` takes it ``FOR UPDATE``). Tailing stays safe because a notification id is
``(transaction id << 16) + ordinal`` and readers only see ids below the oldest transaction still in
progress (``pg_snapshot_xmin``): every id under that bound is final, so a reader never passes a row
that commits later. A long-open writing transaction delays readers; it never makes them skip.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec
import psycopg
from eventsourcing.persistence import (
    IntegrityError,
    InterfaceError,
    Notification,
    OperationalError,
    PersistenceError,
    ProgrammingError,
    StoredEvent,
)
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from eventsourcing.utils import retry
from psycopg import errors as pg_errors
from psycopg import pq
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Composed, Identifier

from baton.adapters.eventstore.fenced import (
    AppendConflict,
    DuplicateSubmission,
    FenceViolation,
    Riders,
    RunRow,
    SubmissionRow,
    fence_missed,
    library_error_class,
)
from baton.adapters.eventstore.postgres_async import AsyncAppends
from baton.domain.fencing import Fence

PAGE = 1000  # rows per page of a run's history (a resume finds fewer than 100 behind its snapshot)
MAX_POSITION = 2**63 - 1

__all__ = ["FencedPostgresRecorder"]

_FENCE_SQLSTATE = "23F01"
# Each connection keeps the cursor its appends execute on: a new cursor per append (its adapters
# map, its transformer) was about a tenth of a single append's client CPU (paired runs: 0.89). A
# connection serves one thread at a time, so its cursor does too.
_APPEND_CURSOR = "_baton_append_cursor"
# Set on a connection once ``_execute_one`` knows whether it can use it: True once the one-event
# append is prepared on it (under ``_ONE_NAME``), False if the connection's encoding is not UTF-8.
_ONE_PREPARED = "_baton_append_one_prepared"
_ONE_NAME = b"baton_append_one"
_KEEP_FROM_POOL_SIZE = 3  # the smallest pool (its maximum) that keeps a connection for appends
_FENCE_TYPES = {
    "run_id": "text",
    "expected_head": "bigint",
    "expected_head_digest": "text",
    "expected_epoch": "bigint",
    "expected_holder": "text",
    "new_head": "bigint",
    "new_head_digest": "text",
    "new_epoch": "bigint",
    "new_holder": "text",
    "new_expires_at": "bigint",
    "stage": "text",
    "status": "text",
}
_FENCE_FIELDS = tuple(_FENCE_TYPES)  # ``Fence``'s fields, in order

# The append of a batch, a multi-run append or a run's first append, set-based: one statement per
# step whatever the number of runs (a PL/pgSQL call per run cost about 65 µs of server time each).
# Rows are taken in one global order, so two appends cannot deadlock: first the new runs' rows,
# inserted in run id order (byte order, which is Python's ``sorted``), then the existing runs' rows,
# locked in the same order. (Locking existing runs first let an insert of a run that a racing
# append had just created wait on that append, while it waited on the insert's other new run.)
# Every existing run's fence is then checked before any submission or event row is written; a
# missed fence names the first run (in that order) whose compare-and-set failed, with that run's
# current row. A batch that both collides on a new run and misses a fence reports the collision
# (``baton_runs_pkey``): the ledger re-decides every submission of a failed batch either way.
_APPEND_FUNCTION = """
CREATE OR REPLACE FUNCTION {schema}.baton_append(
    p_new_runs json, p_fences json, p_submissions json, p_events json, p_states bytea[]) RETURNS void
LANGUAGE plpgsql AS $append$
DECLARE
    fenced text[];
    missed text;
    cur record;
BEGIN
    IF p_new_runs IS NOT NULL THEN
        INSERT INTO {schema}.baton_runs
        SELECT f.run_id, f.new_head, f.new_head_digest, f.new_epoch, f.new_holder, f.new_expires_at, f.stage,
            f.status
        FROM json_to_recordset(p_new_runs) AS f(<fence columns>) ORDER BY f.run_id COLLATE "C";
    END IF;
    IF p_fences IS NOT NULL THEN
        PERFORM 1 FROM {schema}.baton_runs r
        WHERE r.run_id IN (SELECT f.run_id FROM json_to_recordset(p_fences) AS f(run_id text))
        ORDER BY r.run_id COLLATE "C" FOR UPDATE;
        WITH done AS (
            UPDATE {schema}.baton_runs r SET head = f.new_head, head_digest = f.new_head_digest,
                epoch = f.new_epoch, holder = f.new_holder, expires_at = f.new_expires_at, stage = f.stage,
                status = f.status
            FROM json_to_recordset(p_fences) AS f(<fence columns>)
            WHERE r.run_id = f.run_id AND r.head = f.expected_head AND r.head_digest = f.expected_head_digest
                AND r.epoch = f.expected_epoch AND r.holder IS NOT DISTINCT FROM f.expected_holder
            RETURNING r.run_id)
        SELECT array_agg(run_id) INTO fenced FROM done;
        IF cardinality(fenced) IS DISTINCT FROM json_array_length(p_fences) THEN
            SELECT f.run_id INTO missed FROM json_to_recordset(p_fences) AS f(run_id text)
            WHERE f.run_id <> ALL(coalesce(fenced, '{{}}')) ORDER BY f.run_id COLLATE "C" LIMIT 1;
            SELECT head, epoch, holder INTO cur FROM {schema}.baton_runs WHERE run_id = missed;
            RAISE EXCEPTION 'baton fence violated on run %', missed USING ERRCODE = '23F01',
                DETAIL = json_build_object('head', cur.head, 'epoch', cur.epoch, 'holder', cur.holder)::text;
        END IF;
    END IF;
    INSERT INTO {schema}.baton_submissions
    SELECT s.submission_id, s.run_id, s.content_digest, s.position
    FROM json_to_recordset(p_submissions) AS s(submission_id text, run_id text, content_digest text, position bigint);
    INSERT INTO {schema}.{table} (originator_id, originator_version, topic, state, notification_id)
    SELECT e.v->>0, (e.v->>1)::bigint, e.v->>2, p_states[e.n], (pg_current_xact_id()::text::bigint << 16) + e.n
    FROM json_array_elements(p_events) WITH ORDINALITY AS e(v, n);
END
$append$
""".replace("<fence columns>", ", ".join(f"{name} {sql_type}" for name, sql_type in _FENCE_TYPES.items()))

# Taken by ``store init`` and by an in-place upgrade of ``baton_append`` for their transaction.
_SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(hashtext('baton schema'))"

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
        self._pool_opened = False
        # A connection kept for appends, where the pool can spare one: a pool of one or two (a
        # one-shot CLI command's) would then open another for every read, or have none for it.
        self._kept = _KeptConnection(datastore) if datastore.pool.max_size >= _KEEP_FROM_POOL_SIZE else None
        self._riders = _RidersSlot()
        schema = Identifier(datastore.schema)
        table = Identifier(events_table_name)
        fmt = {"schema": schema, "table": table}
        self.append_function = SQL(_APPEND_FUNCTION).format(**fmt)
        self.append_signature = (
            SQL("{schema}.baton_append(json, json, json, json, bytea[])").format(**fmt).as_string(None)
        )
        self.sql_create_statements = [
            SQL(_SCHEMA_LOCK).format(),  # one transaction: concurrent inits and in-place upgrades take turns
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
                "head_digest text NOT NULL, "
                "epoch bigint NOT NULL, holder text, expires_at bigint, stage text NOT NULL, status text NOT NULL)"
            ).format(**fmt),
            SQL(
                "CREATE TABLE IF NOT EXISTS {schema}.baton_submissions (submission_id text PRIMARY KEY, "
                "run_id text NOT NULL, content_digest text NOT NULL, position bigint NOT NULL)"
            ).format(**fmt),
            self.append_function,
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
        # Rendered to plain strings once: psycopg would re-render a Composed query on every execute.
        # The rows go as JSON texts (new runs' and other runs' fences, submissions, event keys) and
        # one binary bytea array (the envelopes), which the function reads set-based: psycopg dumps
        # a Python list element by element, and twenty lists cost about 10 µs per submission of a
        # batch (215 µs for 20 submissions on 20 runs, against 49 µs this way).
        self.append_statement = (
            SQL("SELECT {schema}.baton_append(%s::json, %s::json, %s::json, %s::json, %b::bytea[])")
            .format(**fmt)
            .as_string(None)
        )
        # Positional parameters (see ``append_query``): psycopg reorders a dict on every execute.
        self.append_one_statement = (
            SQL(
                "WITH baton_f AS (UPDATE {schema}.baton_runs SET head = %s, head_digest = %s, epoch = %s, "
                "holder = %s, expires_at = %s, stage = %s, status = %s WHERE run_id = %s AND head = %s "
                "AND head_digest = %s AND epoch = %s AND holder IS NOT DISTINCT FROM %s::text RETURNING run_id, head), "
                "baton_s AS (INSERT INTO {schema}.baton_submissions SELECT %s, run_id, %s, head FROM baton_f) "
                "INSERT INTO {schema}.{table} (originator_id, originator_version, topic, state, notification_id) "
                "SELECT run_id, head, %s, %s, (pg_current_xact_id()::text::bigint << 16) + 1 FROM baton_f"
            )
            .format(**fmt)
            .as_string(None)
        )
        # The same statement for libpq itself (``_execute_one``): numbered parameters, declared types.
        self.append_one_libpq = _numbered(self.append_one_statement).encode()
        self.select_run_statement = (
            SQL("SELECT head, epoch, holder FROM {schema}.baton_runs WHERE run_id = %s").format(**fmt).as_string(None)
        )
        self.page_statement = (
            SQL(
                "SELECT topic, state FROM {schema}.{table} WHERE originator_id = %s AND originator_version > %s "
                "AND originator_version <= %s ORDER BY originator_version LIMIT %s"
            )
            .format(**fmt)
            .as_string(None)
        )
        self.safe_bound = SQL("(pg_snapshot_xmin(pg_current_snapshot())::text::bigint << 16)")
        self.max_notification_id_statement = (
            SQL("SELECT MAX(notification_id) FROM {schema}.{table} WHERE notification_id < ").format(**fmt)
            + self.safe_bound
        )

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        """Fence and insert in ONE statement: one round trip, one transaction.

        The library's pipelined append costs about 13 round trips. The common case (one event of
        one submission on an existing run) is a single plain statement with scalar parameters;
        anything else goes through ``baton_append``, which does the same work with arrays (run
        rows locked first, in sorted order, then submissions, then events). A retry after a lost
        connection is safe: if the append did commit, the retry's compare-and-set misses (or its
        submission ids collide), and the ledger re-decides, finds the submission recorded and
        answers ``duplicate`` with the original position.
        """
        fences: Sequence[Fence] = kwargs.get("fences", ())
        submissions: Sequence[SubmissionRow] = kwargs.get("submissions", ())
        if not self._pool_opened:
            with self.datastore.get_connection():  # opens the pool the library's way, once
                self._pool_opened = True
        riders = self._riders.current
        statement, params, checked = self.append_query(fences, submissions, stored_events, riders)
        kept = self._kept
        if kept is not None and kept.lock.acquire(blocking=False):  # the common case: the kept connection is free
            try:
                self._append_kept(kept, statement, params, checked)
            finally:
                kept.lock.release()
            return None
        # No kept connection, or another thread is appending on it: one from the pool, directly
        # rather than through ``datastore.get_connection()`` (two context managers and a no-op
        # commit less; autocommit: the statement is its own transaction), errors translated as
        # the library does.
        pool = self.datastore.pool
        try:
            conn = pool.getconn()
            try:
                self._append_on(conn, statement, params, checked)
            finally:
                pool.putconn(conn)
        except psycopg.Error as exc:
            raise _library_error(exc) from exc
        return None  # no notification ids: the ledger does not use them, so the library builds no Recordings

    def _append_kept(self, kept: _KeptConnection, statement: str, params: Sequence[Any], checked: str | None) -> None:
        """The append on the kept connection; one left broken or busy is replaced at the next append."""
        try:
            self._append_on(kept.take(), statement, params, checked)
        except psycopg.Error as exc:  # the pool's errors too (no connection in time, a closed pool)
            raise _library_error(exc) from exc

    def _append_on(
        self, conn: psycopg.Connection[Any], statement: str, params: Sequence[Any], checked: str | None
    ) -> None:
        written = self._execute_one(conn, params) if statement is self.append_one_statement else None
        if written is None:  # psycopg sends it
            curs = self._append_cursor(conn)
            try:
                curs.execute(statement, params, prepare=True)
            except pg_errors.UndefinedFunction as exc:
                if checked is not None or "baton_append(" not in (exc.diag.message_primary or ""):
                    raise  # not this version's baton_append missing: a rider's, say
                self._install_append_function(conn)  # a store made before this ``baton_append``
                curs.execute(statement, params, prepare=True)
            written = curs.rowcount
        if checked is not None and written != 1:  # the plain statement's compare-and-set missed
            curs = self._append_cursor(conn)
            curs.execute(self.select_run_statement, (checked,), prepare=True)
            raise fence_missed(checked, curs.fetchone())

    def _execute_one(self, conn: psycopg.Connection[Any], params: Sequence[Any]) -> int | None:
        """The one-event append through libpq itself: the rows it wrote (1, or 0 on a missed fence),
        or None where psycopg must send it (a connection not in UTF-8, a text with a NUL).

        The most common statement skips psycopg's query conversion and parameter dumping, about
        a tenth of a single append's client CPU: its parameters have fixed types (``_ONE_TYPES``)
        and go as UTF-8 text, the envelope as binary. libpq's own call waits for the answer, with
        the GIL released. As with psycopg2's default, a Ctrl-C arriving meanwhile is raised when the
        server has answered: psycopg's interruptible wait (``conn.wait``, which cancels the statement
        on the server) cost a tenth of the append's client CPU (paired runs: 1.095). An append waits
        on a run row only while another append to that run commits. Errors are raised as psycopg
        would raise them.
        """
        prepared = getattr(conn, _ONE_PREPARED, None)
        if prepared is None:
            prepared = conn.info.encoding == "utf-8"
            if prepared:
                self._prepare_one(conn)
            setattr(conn, _ONE_PREPARED, prepared)  # dies with the connection when it is dropped
        if not prepared:
            return None
        values: list[bytes | None] = [None if v is None else str(v).encode() for v in params[:-1]]
        if b"\x00" in b"".join(filter(None, values)):  # libpq would cut the text there; psycopg refuses it
            return None
        values.append(params[-1])  # the envelope, binary
        result = _run_one(conn, values)
        if result.error_field(_SQLSTATE) == _NO_SUCH_STATEMENT:
            # psycopg sends DEALLOCATE ALL after a rollback on a connection with its own prepared
            # statements, which drops this one too; the statement did not run, so run it again
            self._prepare_one(conn)
            result = _run_one(conn, values)
        _check_result(conn, result)
        return result.command_tuples or 0

    def _prepare_one(self, conn: psycopg.Connection[Any]) -> None:
        """Prepare the one-event append on ``conn``; one prepared already (a first time that was
        interrupted before it was noted) is the same statement."""
        result = conn.pgconn.prepare(_ONE_NAME, self.append_one_libpq, _ONE_TYPES)
        if result.error_field(_SQLSTATE) != _PREPARED_ALREADY:
            _check_result(conn, result)

    @staticmethod
    def _append_cursor(conn: psycopg.Connection[Any]) -> psycopg.Cursor[Any]:
        curs: psycopg.Cursor[Any] | None = getattr(conn, _APPEND_CURSOR, None)
        if curs is None or curs.closed:
            curs = conn.cursor(row_factory=tuple_row)
            setattr(conn, _APPEND_CURSOR, curs)  # dies with the connection when it is dropped
        return curs

    def _install_append_function(self, conn: psycopg.Connection[Any]) -> None:
        """Upgrade a store in place: create this version's ``baton_append`` next to an older one.

        Older processes keep calling theirs (another signature), so a rolling upgrade needs no
        downtime. The lock that ``store init`` takes too keeps upgrading processes and an init from
        racing on the catalogue (``tuple concurrently updated``); under it, a function another
        process created meanwhile is left alone.
        """
        try:
            with conn.transaction(), conn.cursor(row_factory=tuple_row) as curs:
                curs.execute(_SCHEMA_LOCK)
                if curs.execute("SELECT to_regprocedure(%s)", (self.append_signature,)).fetchone() == (None,):
                    curs.execute(self.append_function)
        except pg_errors.InsufficientPrivilege as exc:
            msg = f"this store's baton_append is older than this Baton: run `baton store init` as its owner ({exc})"
            raise ProgrammingError(msg) from exc

    def append_query(
        self,
        fences: Sequence[Fence],
        submissions: Sequence[SubmissionRow],
        events: Sequence[StoredEvent],
        riders: Riders | None = None,
    ) -> tuple[str, Sequence[Any], str | None]:
        """An append as one statement and its parameters, ``riders`` in it (see ``riding``).

        The common case (one event of one submission on an existing run) is a plain statement with
        scalar parameters whose compare-and-set may miss without an error: then the third item is
        the run id to look up (``fence_missed``), and nothing was appended. Anything else goes
        through ``baton_append``, which raises on a fence violation.
        """
        if len(fences) == len(submissions) == len(events) == 1 and fences[0].expected_head > 0:
            fence, row, event = fences[0], submissions[0], events[0]
            statement = self.append_one_statement
            params: Sequence[Any] = (
                fence.new_head,
                fence.new_head_digest,
                fence.new_epoch,
                fence.new_holder,
                fence.new_expires_at,
                fence.stage,
                fence.status,
                fence.run_id,
                fence.expected_head,
                fence.expected_head_digest,
                fence.expected_epoch,
                fence.expected_holder,
                row.submission_id,
                row.content_digest,
                event.topic,
                event.state,
            )
            if riders is not None:
                statement, params = f"WITH {riders[0]}, {statement.removeprefix('WITH ')}", (*riders[1], *params)
            return statement, params, fence.run_id
        params = _append_params(fences, submissions, events)
        if riders is None:
            return self.append_statement, params, None
        return f"WITH {riders[0]} {self.append_statement}", (*riders[1], *params), None

    def close(self) -> None:
        """Give back the connection kept for appends; the datastore closes the pool."""
        if self._kept is not None:
            self._kept.close()

    def async_appends(self) -> AsyncAppends:
        """These appends from an event loop, on asyncio connections to the same database."""
        return AsyncAppends(self)

    @staticmethod
    def library_error(exc: psycopg.Error) -> PersistenceError:
        """The library's error for a psycopg one, integrity errors as the fenced recorders' failures."""
        return _library_error(exc)

    def riding(self, ctes: str, params: Sequence[Any]) -> _Riding:
        """Run ``ctes`` (data-modifying ``name AS (...)`` clauses, names not starting with ``baton_``) in
        the statement of every append this thread makes inside the returned context: one round trip,
        one transaction.

        For side tables written with an append (blobs its events reference, a view's fold): a fence
        violation or a conflict that raises rolls them back with the append; a fast-path compare-and-set
        miss (no error, nothing appended) still commits them, so they must be safe to run again: ON
        CONFLICT DO NOTHING inserts, compare-and-set updates. PostgreSQL runs the clauses of one statement
        in no documented order, so they must not depend on the append's own writes.
        """
        return _Riding(self._riders, (ctes, params))

    def stream_events(self, run_id: str, *, after: int = 0, upto: int | None = None) -> Iterator[tuple[str, bytes]]:
        """(topic, state) of a run's events in position order, a page of 1000 at a time.

        Keyset pages by plain prepared query, binary results, on one connection: a short tail (a
        resume after a snapshot) is one round trip, and a long run costs one per page, fewer than
        a server-side cursor's transaction, declare, fetches and close. Memory stays flat.
        """
        last = MAX_POSITION if upto is None else upto
        with self.datastore.get_connection() as conn, conn.cursor(row_factory=tuple_row, binary=True) as curs:
            while True:
                curs.execute(self.page_statement, (run_id, after, last, PAGE), prepare=True)
                page = curs.fetchall()
                yield from page  # binary results: bytea arrives as bytes
                if len(page) < PAGE:
                    return
                after += len(page)  # a run's positions are contiguous

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

    def select_log(self, after: int, limit: int) -> list[tuple[int, str, bytes]]:
        """(notification id, topic, state) after ``after``, in notification order, below the safe bound.

        What a log follower needs and nothing else: tuple rows, three columns, one prepared
        statement (``select_notifications`` builds a library ``Notification`` per row).
        """
        with self.datastore.get_connection() as conn, conn.cursor(row_factory=tuple_row, binary=True) as curs:
            curs.execute(self.log_statement, (after, limit), prepare=True)
            return curs.fetchall()  # binary results: bytea arrives as bytes, not hex to decode

    @functools.cached_property
    def log_statement(self) -> Composed:
        # The limit is applied in index order first and the safe bound after it: with the bound in the
        # same WHERE the planner cannot estimate it, bitmap-scans every row below it and sorts them
        # (on disk for a large log) to return one page. Rows past the bound only shorten the page,
        # which tells the follower to stop there, as it must.
        return (
            SQL(
                "SELECT notification_id, topic, state FROM (SELECT notification_id, topic, state FROM {schema}.{table} "
                "WHERE notification_id > %s ORDER BY notification_id LIMIT %s) AS page WHERE notification_id < "
            ).format(schema=Identifier(self.datastore.schema), table=Identifier(self.events_table_name))
            + self.safe_bound
            + SQL(" ORDER BY notification_id")
        )

    def select_runs(self) -> list[RunRow]:
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            curs.execute(SQL("SELECT * FROM {0}.baton_runs ORDER BY run_id").format(Identifier(self.datastore.schema)))
            return [RunRow(**row) for row in curs.fetchall()]

    def select_run(self, run_id: str) -> RunRow | None:
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            curs.execute(
                SQL("SELECT * FROM {0}.baton_runs WHERE run_id = %s").format(Identifier(self.datastore.schema)),
                (run_id,),
            )
            row = curs.fetchone()
        return RunRow(**row) if row is not None else None

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


class _KeptConnection:
    """One pooled connection a recorder keeps checked out for its appends, and gives back on close.

    Checking a connection out of the pool and back in for every append (the pool's lock,
    condition, statistics and return checks) was about a tenth of a single append's client CPU.
    The kept connection still counts against the pool's maximum. A thread that finds it in use
    appends on one from the pool instead, so threads never queue behind each other here. It is
    given back and replaced when it is not idle (broken, or left busy by an interrupt) and after
    the pool's ``max_lifetime`` (counted from when it was kept), as the pool would replace it.
    """

    def __init__(self, datastore: PostgresDatastore) -> None:
        self.lock = threading.Lock()  # held by the thread appending on the connection
        self._datastore = datastore
        self._conn: psycopg.Connection[Any] | None = None
        self._replace_at = 0.0
        self._closed = False

    def take(self) -> psycopg.Connection[Any]:
        """The connection (the caller holds ``lock``), checked out of the pool on first use.

        One that is not idle (broken, or left busy by an interrupt) or has been kept for the pool's
        ``max_lifetime`` goes back to the pool, which closes it, and another is checked out.
        """
        conn = self._conn
        if conn is None or conn.pgconn.transaction_status != _IDLE or time.monotonic() >= self._replace_at:
            self.give_back()
            if self._closed:  # an append racing ``close``: no connection the pool would not close
                raise psycopg.InterfaceError("the store is closed")
            pool = self._datastore.pool
            conn = self._conn = pool.getconn()
            self._replace_at = time.monotonic() + pool.max_lifetime
        return conn

    def give_back(self) -> None:
        """Return the connection to the pool, which closes it if it is broken or too old."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._datastore.pool.putconn(conn)

    def close(self) -> None:
        """Give the connection back before the pool closes: the pool closes only those it holds."""
        with self.lock:
            self._closed = True
            self.give_back()


def _numbered(statement: str) -> str:
    """``statement`` with libpq's numbered placeholders (``$1``...) for psycopg's ``%s``."""
    parts = statement.split("%s")
    return "".join(part + f"${n}" for n, part in enumerate(parts[:-1], 1)) + parts[-1]


def _run_one(conn: psycopg.Connection[Any], values: list[bytes | None]) -> pq.abc.PGresult:
    return conn.pgconn.exec_prepared(_ONE_NAME, values, _ONE_FORMATS)  # type: ignore[arg-type]  # None: NULL


def _check_result(conn: psycopg.Connection[Any], result: Any) -> None:
    """Raise what psycopg would raise for a libpq result that is not a success: a lost connection
    as ``OperationalError`` (the append is retried on another), a refusal as its SQLSTATE's class."""
    if result.status in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
        return
    if conn.pgconn.status == pq.ConnStatus.BAD:
        message = result.error_message.decode(errors="replace").strip()
        raise psycopg.OperationalError(f"the connection was lost: {message}")
    raise pg_errors.error_from_result(result, encoding=conn.info.encoding)


_INT8, _TEXT, _BYTEA = (psycopg.adapters.types[name].oid for name in ("int8", "text", "bytea"))
# The types of ``append_one_statement``'s parameters: the fence's new row, its expected row, the
# submission's id and digest, the event's topic and envelope.
_ONE_TYPES = (
    *(_INT8, _TEXT, _INT8, _TEXT, _INT8, _TEXT, _TEXT),
    *(_TEXT, _INT8, _TEXT, _INT8, _TEXT),
    *(_TEXT, _TEXT),
    *(_TEXT, _BYTEA),
)
_ONE_FORMATS = (pq.Format.TEXT,) * (len(_ONE_TYPES) - 1) + (pq.Format.BINARY,)
_SQLSTATE = pq.DiagnosticField.SQLSTATE
_IDLE = pq.TransactionStatus.IDLE
_NO_SUCH_STATEMENT, _PREPARED_ALREADY = b"26000", b"42P05"


class _RidersSlot(threading.local):
    """This thread's riders, None outside ``riding``: a default, as ``getattr`` of a missing
    attribute of a thread-local raises and catches an AttributeError on every append."""

    current: Riders | None = None


class _Riding:
    """Sets this thread's riders for the appends inside it (a class: a put enters one per append)."""

    __slots__ = ("_local", "_outer", "_riders")

    def __init__(self, local: _RidersSlot, riders: tuple[str, Sequence[Any]]) -> None:
        self._local = local
        self._riders = riders
        self._outer: tuple[str, Sequence[Any]] | None = None

    def __enter__(self) -> None:
        self._outer = self._local.current
        self._local.current = self._riders

    def __exit__(self, *exc: object) -> None:
        self._local.current = self._outer


def _append_params(
    fences: Sequence[Fence], submissions: Sequence[SubmissionRow], events: Sequence[StoredEvent]
) -> tuple[Any, ...]:
    """The parameters of ``append_statement``: fences (of new runs, then of the others; None for
    none) and submissions as JSON objects (their fields), each event's run, position and topic as
    a JSON array, the envelopes as they are. JSON goes as text: psycopg would send bytes as bytea."""
    if len({f.run_id for f in fences}) != len(fences):  # set-based: one compare-and-set per run
        raise ValueError(f"an append takes one fence per run, not {sorted(f.run_id for f in fences)}")
    new_runs = [f for f in fences if f.expected_head == 0]
    others = [f for f in fences if f.expected_head != 0] if new_runs else fences
    return (
        _json.encode(new_runs).decode() if new_runs else None,  # in any order: the function orders its locks
        _json.encode(others).decode() if others else None,
        _json.encode(submissions).decode(),
        _json.encode([(str(e.originator_id), e.originator_version, e.topic) for e in events]).decode(),
        [e.state for e in events],
    )


_json = msgspec.json.Encoder()
_SUBMISSION_COLUMNS = ("submission_id", "run_id", "content_digest", "position")
# ``json_to_recordset`` reads a missing key as NULL: a renamed field must fail here, loudly.
_fields = {cls: tuple(f.name for f in msgspec.structs.fields(cls)) for cls in (Fence, SubmissionRow)}
if (_fields[Fence], _fields[SubmissionRow]) != (_FENCE_FIELDS, _SUBMISSION_COLUMNS):
    raise RuntimeError("Fence or SubmissionRow fields changed: update the append statement's JSON columns")


def _library_error(exc: psycopg.Error) -> PersistenceError:
    """The error ``PostgresDatastore.get_connection`` would raise, with integrity errors translated."""
    error = library_error_class(exc, psycopg)(str(exc))
    error.__cause__ = exc
    return _translate(error) if isinstance(error, IntegrityError) else error


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
