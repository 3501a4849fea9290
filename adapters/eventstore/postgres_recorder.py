"""The PostgreSQL recorder: eventsourcing's recorder, with the fence in the same statement as the insert.

eventsourcing's ``PostgresApplicationRecorder.insert_events`` opens one transaction, runs
``_insert_events`` and then its own table lock, ``NOTIFY`` and insert. This recorder keeps that
order with one change: every append first takes the append lock (``postgres_schema.APPEND_LOCK``),
held until it commits, in place of the table lock, so notification ids commit in id order and a
tailing reader never skips one. Then the run rows are fenced (``baton_fence`` locks them ``FOR
UPDATE``, in run id order) and the submission rows inserted: a stale writer is refused with SQLSTATE
``23F01`` (class 23, an ``IntegrityError`` the library does not retry) and nothing of its append is
stored.

An append is one statement: one round trip instead of the library pipeline's several, as the
library's own ``enable_db_functions`` path is (which, unlike these, skips ``_insert_events``). The
usual append (one submission's events on a run that exists) is a plain SQL statement whose
compare-and-set feeds its inserts; any other calls ``baton_append_events``, which runs the steps
above in that order inside the server. An append with riders (side-table clauses) takes the
library's transaction, with the same statements.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any, cast

from eventsourcing.persistence import IntegrityError, InterfaceError, OperationalError, StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from eventsourcing.utils import retry
from psycopg import Cursor
from psycopg.abc import QueryNoTemplate
from psycopg.errors import InsufficientPrivilege
from psycopg.rows import DictRow
from psycopg.sql import SQL, Identifier

from baton.adapters.eventstore import postgres_schema
from baton.adapters.eventstore.fenced import (
    AppendConflict,
    DuplicateSubmission,
    FenceViolation,
    Riders,
    RunRow,
    SubmissionRow,
    fence_missed,
)
from baton.adapters.eventstore.ports import AsyncAppender
from baton.adapters.eventstore.postgres_append import (
    Statement,
    append_call,
    append_params,
    before_events,
    blob_insert,
    one_run_append,
    one_run_params,
    translate,
)
from baton.adapters.eventstore.postgres_async import AsyncAppends
from baton.adapters.eventstore.postgres_liveness import PostgresSession, session_alive
from baton.adapters.eventstore.store_identity import StoreIdentity
from baton.domain.fencing import Fence

__all__ = ["FencedPostgresRecorder"]


class _Riders(threading.local):
    current: Riders | None = None


class FencedPostgresRecorder(PostgresApplicationRecorder):
    """The library's PostgreSQL application recorder, with fences and submission ids in each append."""

    def __init__(self, datastore: PostgresDatastore, *, events_table_name: str = "stored_events") -> None:
        super().__init__(datastore, events_table_name=events_table_name)
        self.sql_create_statements = []  # the schema is the migrations' (``postgres_schema``)
        self._riders = _Riders()
        self.notify_statement = SQL("NOTIFY {0}").format(Identifier(self.channel_name))
        # the append lock (``postgres_schema.APPEND_LOCK``) orders notification ids instead of the
        # library's table lock: taking both would deadlock the one-statement append with the others
        self.lock_table_statements = []
        self.append_call = append_call(self.datastore.schema)
        self.one_run_append = one_run_append(self.datastore.schema, self.events_table_name)
        self.one_run_read_append = one_run_append(self.datastore.schema, self.events_table_name, read_fence=True)
        self._session = PostgresSession(self.datastore.pool)
        self._relay_session = PostgresSession(self.datastore.pool, name="baton-relay")

    def create_table(self) -> None:
        """What the library calls under ``CREATE_TABLE=y``: apply the migrations."""
        self.migrate()

    def migrate(self) -> list[int]:
        with self.datastore.get_connection() as conn:
            done = postgres_schema.migrate(conn, self.datastore.schema, self.events_table_name)
        self.datastore.register_type_adapters()  # the composite type the library's insert unnests
        return done

    def check_schema(self) -> None:
        with self.datastore.get_connection() as conn:
            postgres_schema.check_schema(conn, self.datastore.schema, self.events_table_name)

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)  # as the library's own append
    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        """Append in one statement (or the library's transaction, with riders or blobs), failures named as the
        fence's.

        A retry after a lost connection is safe: if the first try did commit, the retry's fence
        misses (or its submission ids collide), and the ledger finds the submission recorded.
        """
        try:
            if self._riders.current is not None or kwargs.get("blobs"):
                notification_ids: Sequence[int] | None = super().insert_events(stored_events, **kwargs)
                return notification_ids
            fences, submissions = kwargs.get("fences", ()), kwargs.get("submissions", ())
            one = one_run_params(fences, submissions, stored_events)
            if one is not None:
                return self._append_one_run(one)
            params = append_params(fences, submissions, stored_events, self.channel_name)
            with self.datastore.get_connection() as conn, conn.cursor() as curs:
                curs.execute(self.append_call, params, prepare=True)
                return [row["baton_append_events"] for row in curs.fetchall()]
        except (FenceViolation, AppendConflict, DuplicateSubmission):
            raise  # already named: the one-statement append's fence miss
        except IntegrityError as exc:
            raise translate(exc) from exc

    def _append_one_run(self, params: dict[str, Any]) -> list[int]:
        """The usual append in one plain statement; no row back means the fence missed."""
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            statement = self.one_run_read_append if "read_run_id" in params else self.one_run_append
            curs.execute(statement, params, prepare=True)
            ids = [row["notification_id"] for row in curs.fetchall()]
        if not ids:
            row = self.select_run(params["run_id"])
            raise fence_missed(params["run_id"], None if row is None else (row.head, row.epoch, row.holder))
        return ids

    def _insert_events(
        self,
        curs: Cursor[DictRow],
        stored_events: Sequence[StoredEvent],
        *,
        fences: Sequence[Fence] = (),
        submissions: Sequence[SubmissionRow] = (),
        blobs: Mapping[str, bytes] | None = None,
        **kwargs: Any,
    ) -> None:
        for statement, params in before_events(self.datastore.schema, fences, submissions, self._riders.current):
            curs.execute(statement, params)
        if blobs:  # what the events reference (a handoff's state), committed with them or not at all
            curs.execute(*blob_insert(self.datastore.schema, blobs))
        super()._insert_events(curs, stored_events, **kwargs)

    def append_statements(
        self,
        stored_events: Sequence[StoredEvent],
        fences: Sequence[Fence],
        submissions: Sequence[SubmissionRow],
        riders: Riders | None,
    ) -> list[Statement]:
        """Every statement of an append, in the order ``insert_events`` runs them, for a connection
        that is not the library's (the asyncio appends): the library has no asyncio API."""
        events = [
            self.construct_pg_stored_event(e.originator_id, e.originator_version, e.topic, e.state)
            for e in stored_events
        ]
        return [
            *before_events(self.datastore.schema, fences, submissions, riders),
            # typed as psycopg's ``Query``, which takes in t-strings too; the library's are ``Composed``
            *((cast("QueryNoTemplate", statement), ()) for statement in self.lock_table_statements),
            (self.notify_statement, ()),
            (self.insert_events_statement, (events,)),
        ]

    @contextlib.contextmanager
    def riding(self, ctes: str, params: Sequence[Any]) -> Iterator[None]:
        """Run ``ctes`` (data-modifying ``name AS (...)`` clauses, names not starting with ``baton_``) in
        the transaction of every append this thread makes inside the context.

        For side tables written with an append (blobs its events reference, a view's fold): a
        refused append rolls them back with it. They run after the fence and the submission rows,
        before the events.
        """
        outer = self._riders.current
        self._riders.current = (ctes, params)
        try:
            yield
        finally:
            self._riders.current = outer

    def async_appender(self) -> AsyncAppender:
        """These appends from an event loop, on asyncio connections to the same database."""
        info = self.datastore.psycopg_type_adapters.get(self.stored_event_type_name)
        return AsyncAppends(self.datastore.pool, self.append_statements, info)

    def close(self) -> None:
        """Close the liveness and relay sessions, if opened; the application closes the library's pool."""
        self._session.close()
        self._relay_session.close()

    def hold_relay(self) -> bool:
        """The relay lock is a session advisory lock on a dedicated connection, one per schema: it
        ends with the process (its socket closes) or when the server ends the session."""
        return self._relay_session.hold(f"baton relay {self.datastore.schema}")

    def session(self) -> str:
        """A dedicated connection's backend is the session (``postgres_liveness``), opened on first use."""
        return self._session.token()

    def session_alive(self, token: str) -> bool:
        with self.datastore.get_connection() as conn:
            return session_alive(conn, token)

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
            )
            row = curs.fetchone()
        return SubmissionRow(**row) if row is not None else None

    def select_blobs(self, digests: Collection[str]) -> dict[str, bytes]:
        if not digests:
            return {}
        statement = SQL("SELECT digest, data FROM {0}.baton_blobs WHERE digest = ANY(%s)")
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            curs.execute(statement.format(Identifier(self.datastore.schema)), ([*digests],))
            return {row["digest"]: bytes(row["data"]) for row in curs.fetchall()}

    def select_store_identity(self) -> StoreIdentity | None:
        """None also for a role that may not read ``baton_store`` (docs/operations.md, "Store identity"):
        its resumes fold from the log."""
        statement = SQL("SELECT store_id, public_key, private_key FROM {0}.baton_store")
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            try:
                curs.execute(statement.format(Identifier(self.datastore.schema)))
            except InsufficientPrivilege:
                return None
            row = curs.fetchone()
        return StoreIdentity(row["store_id"], row["public_key"], bytes(row["private_key"])) if row else None
