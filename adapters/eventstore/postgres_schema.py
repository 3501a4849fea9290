"""The PostgreSQL store's schema, as migrations (see ``migrations``), and the code that applies them.

Migrations run in one transaction under an advisory lock, so concurrent ``store init`` runs take
turns instead of racing on the catalogue (``tuple concurrently updated``); DDL is transactional,
so a failed migration leaves the store as it was.

Version 2 moves the store onto the library's recorder: notification ids come from a sequence and
commit in id order under the append lock (``APPEND_LOCK``; version 1 stamped them from the
transaction id, read below a snapshot bound), and the run rows are fenced by ``baton_fence``,
which takes their row locks after that lock. Version 3 passes an append's events as one JSON
parameter instead of four arrays (psycopg adapts one string far more cheaply). Version 4 gives the
store its identity (``baton_store``: an Ed25519 key made in the migration's transaction, see
``store_identity``) and empties the snapshot table, whose untagged rows no resume would use again.
"""

from __future__ import annotations

from typing import Any

from psycopg import Connection, Cursor
from psycopg.rows import TupleRow, tuple_row
from psycopg.sql import SQL, Composable, Identifier, Literal

from baton.adapters.eventstore.migrations import (
    VERSION_TABLE,
    Migration,
    baseline_versions,
    plan,
    require_current,
)
from baton.adapters.eventstore.store_identity import new_identity

__all__ = ["FENCE_COLUMNS", "FENCE_SQLSTATE", "migrations", "migrate", "check_schema"]

FENCE_SQLSTATE = "23F01"  # class 23: the library raises it as an IntegrityError and never retries it
FENCE_COLUMNS = {  # ``Fence``'s fields, in order, as ``json_to_recordset`` reads them
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
_SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(hashtext('baton schema'))"
# Every append takes this lock before its events get their notification ids and holds it until it
# commits, so ids commit in id order and a tailing reader never skips one: the role the library's
# table lock plays, which Baton's appends do not take (a statement holds its tables' row-exclusive
# locks before it runs, so a table lock taken after this one would invert the order and deadlock).
APPEND_LOCK = "pg_advisory_xact_lock(7290150301)"

# Row locks in one global order (run id, byte order as Python's ``sorted``), so two appends cannot
# deadlock; a new run's row is its insert, which waits on a concurrent insert of the same run.
_FENCE_FUNCTION = """
CREATE OR REPLACE FUNCTION {schema}.baton_fence(p_fences json) RETURNS void LANGUAGE plpgsql AS $fence$
DECLARE
    f record;
    cur record;
BEGIN
    FOR f IN SELECT * FROM json_to_recordset(p_fences) AS x(<columns>) ORDER BY x.run_id COLLATE "C" LOOP
        IF f.expected_head = 0 THEN
            INSERT INTO {schema}.baton_runs VALUES (f.run_id, f.new_head, f.new_head_digest, f.new_epoch,
                f.new_holder, f.new_expires_at, f.stage, f.status);
            CONTINUE;
        END IF;
        SELECT head, head_digest, epoch, holder INTO cur FROM {schema}.baton_runs WHERE run_id = f.run_id FOR UPDATE;
        IF NOT FOUND OR cur.head <> f.expected_head OR cur.head_digest <> f.expected_head_digest
            OR cur.epoch <> f.expected_epoch OR cur.holder IS DISTINCT FROM f.expected_holder THEN
            RAISE EXCEPTION 'baton fence violated on run %', f.run_id USING ERRCODE = '<sqlstate>',
                DETAIL = json_build_object('run_id', f.run_id, 'head', cur.head, 'epoch', cur.epoch,
                    'holder', cur.holder)::text;
        END IF;
        UPDATE {schema}.baton_runs SET head = f.new_head, head_digest = f.new_head_digest, epoch = f.new_epoch,
            holder = f.new_holder, expires_at = f.new_expires_at, stage = f.stage, status = f.status
        WHERE run_id = f.run_id;
    END LOOP;
END
$fence$
""".replace("<columns>", ", ".join(f"{name} {kind}" for name, kind in FENCE_COLUMNS.items())).replace(
    "<sqlstate>", FENCE_SQLSTATE
)

# One append in one statement: the append lock, fence, submission rows, notification and insert, in
# the order ``PostgresApplicationRecorder.insert_events`` runs them (the append lock in place of the
# library's table lock); the events as one JSON parameter, states in base64 (version 3).
_APPEND_FUNCTION = """
CREATE OR REPLACE FUNCTION {schema}.baton_append_events(p_fences json, p_submissions json, p_events json,
    p_channel text) RETURNS SETOF bigint LANGUAGE plpgsql AS $append$
BEGIN
    PERFORM <append_lock>;
    IF p_fences IS NOT NULL THEN
        PERFORM {schema}.baton_fence(p_fences);
    END IF;
    INSERT INTO {schema}.baton_submissions (submission_id, run_id, content_digest, position)
        SELECT * FROM json_to_recordset(p_submissions)
        AS x(submission_id text, run_id text, content_digest text, "position" bigint);
    PERFORM pg_notify(p_channel, '');
    RETURN QUERY INSERT INTO {schema}.{table} AS t (originator_id, originator_version, topic, state)
        SELECT e.originator_id, e.originator_version, e.topic, decode(e.state, 'base64')
        FROM json_to_recordset(p_events) AS e(originator_id text, originator_version bigint, topic text, state text)
        RETURNING t.notification_id;
END
$append$
""".replace("<append_lock>", APPEND_LOCK)
_DROP_ARRAY_APPEND = (
    "DROP FUNCTION IF EXISTS {schema}.baton_append_events(json, json, text[], bigint[], text[], bytea[], text)"
)

_REFUSE_FUNCTION = """
CREATE OR REPLACE FUNCTION {schema}.baton_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $r$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP;
END
$r$
"""

# The composite type the library's insert unnests (``CREATE TYPE`` has no ``IF NOT EXISTS``).
_EVENT_TYPE = """
DO $t$ BEGIN
    CREATE TYPE {schema}.stored_event_text AS (originator_id text, originator_version bigint, topic text, state bytea);
EXCEPTION WHEN duplicate_object THEN NULL;
END $t$
"""

# Every overload of the version 1 append function, which wrote notification ids of its own.
_DROP_OLD_APPEND = """
DO $d$ DECLARE f regprocedure; BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p WHERE p.proname = 'baton_append'
        AND p.pronamespace = {schema_name}::regnamespace LOOP
        EXECUTE 'DROP FUNCTION ' || f;
    END LOOP;
END $d$
"""

_AUTOVACUUM = (
    "WITH (autovacuum_enabled = true, autovacuum_vacuum_threshold = 100000000, "
    "autovacuum_vacuum_scale_factor = 0.5, autovacuum_analyze_threshold = 1000, "
    "autovacuum_analyze_scale_factor = 0.01)"
)


def migrations(schema: str, events_table: str) -> tuple[Migration, ...]:
    """The migrations of the store whose events table is ``schema.events_table``."""
    snapshots = events_table.removesuffix("_events") + "_snapshots"  # the library's names: {app}_{purpose}
    sequence = Identifier(schema, f"{events_table}_notification_id_seq")
    names: dict[str, Composable] = {
        "schema": Identifier(schema),
        "table": Identifier(events_table),
        "snapshots": Identifier(snapshots),
        "index": Identifier(f"{events_table}_notification_id_idx"),
        "sequence": Literal(sequence.as_string(None)),  # as ``regclass`` reads it: quoted
        "sequence_name": sequence,
        "schema_name": Literal(schema),
        "versions": Identifier(VERSION_TABLE),
    }

    def sql(*statements: str) -> tuple[str, ...]:
        return tuple(SQL(s).format(**names).as_string(None) for s in statements)

    def append_only(*targets: str) -> list[str]:
        return [
            statement
            for target in targets
            for statement in (
                f"CREATE OR REPLACE TRIGGER baton_append_only BEFORE UPDATE OR DELETE ON {{schema}}.{target} "
                "FOR EACH ROW EXECUTE FUNCTION {schema}.baton_refuse_change()",
                f"CREATE OR REPLACE TRIGGER baton_no_truncate BEFORE TRUNCATE ON {{schema}}.{target} "
                "FOR EACH STATEMENT EXECUTE FUNCTION {schema}.baton_refuse_change()",
            )
        ]

    def identity() -> tuple[str, tuple[Any, ...]]:
        insert = "INSERT INTO {schema}.baton_store (store_id, public_key, private_key) VALUES (%s, %s, %s)"
        return sql(insert)[0], tuple(new_identity())

    return (
        Migration(
            0,
            "version table",
            sql("CREATE TABLE IF NOT EXISTS {schema}.{versions} (v integer PRIMARY KEY, name text NOT NULL)"),
        ),
        Migration(
            1,
            "events, snapshots, run rows, submission ids, blobs; append-only triggers",
            sql(
                _EVENT_TYPE,
                "CREATE TABLE IF NOT EXISTS {schema}.{table} (originator_id text NOT NULL, "
                "originator_version bigint NOT NULL, topic text NOT NULL, state bytea NOT NULL, "
                "notification_id bigint NOT NULL, PRIMARY KEY (originator_id, originator_version))",
                "CREATE UNIQUE INDEX IF NOT EXISTS {index} ON {schema}.{table} (notification_id)",
                "CREATE TABLE IF NOT EXISTS {schema}.{snapshots} (originator_id text NOT NULL, "
                "originator_version bigint NOT NULL, topic text, state bytea, "
                f"PRIMARY KEY (originator_id, originator_version)) {_AUTOVACUUM}",
                "CREATE TABLE IF NOT EXISTS {schema}.baton_runs (run_id text PRIMARY KEY, head bigint NOT NULL, "
                "head_digest text NOT NULL, epoch bigint NOT NULL, holder text, expires_at bigint, "
                "stage text NOT NULL, status text NOT NULL)",
                "CREATE TABLE IF NOT EXISTS {schema}.baton_submissions (submission_id text PRIMARY KEY, "
                "run_id text NOT NULL, content_digest text NOT NULL, position bigint NOT NULL)",
                "CREATE TABLE IF NOT EXISTS {schema}.baton_blobs (digest text PRIMARY KEY, data bytea NOT NULL)",
                _REFUSE_FUNCTION,
                *append_only("{table}", "baton_submissions"),
            ),
        ),
        Migration(
            2,
            "notification ids from a sequence under the append lock; baton_fence, baton_append_events",
            sql(
                "CREATE SEQUENCE IF NOT EXISTS {sequence_name} AS bigint OWNED BY {schema}.{table}.notification_id",
                "SELECT setval({sequence}, "
                "coalesce((SELECT max(notification_id) FROM {schema}.{table}), 0) + 1, false)",
                "ALTER TABLE {schema}.{table} ALTER COLUMN notification_id SET DEFAULT nextval({sequence}::regclass)",
                _FENCE_FUNCTION,
                # version 2 also made an append function taking arrays, which version 3 drops; the
                # migrations a store lacks run in one transaction, so no append ever needed it
                _DROP_OLD_APPEND,
            ),
        ),
        Migration(
            3,
            "baton_append_events takes its events as one JSON parameter",
            sql(_APPEND_FUNCTION, _DROP_ARRAY_APPEND),
        ),
        Migration(
            4,
            "the store's identity (baton_store, append-only); snapshots tagged with its key",
            sql(
                "CREATE TABLE {schema}.baton_store (singleton integer PRIMARY KEY DEFAULT 1 CHECK (singleton = 1), "
                "store_id text NOT NULL, public_key text NOT NULL, private_key bytea NOT NULL)",
                *append_only("baton_store"),
                "DELETE FROM {schema}.{snapshots}",  # written untagged: none would be used again
            ),
            seed=identity,
        ),
    )


def migrate(conn: Connection[Any], schema: str, events_table: str) -> list[int]:
    """Apply the migrations the store lacks in one transaction; the versions applied (or recorded)."""
    steps = migrations(schema, events_table)
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as curs:
        curs.execute(_SCHEMA_LOCK)
        recorded, baseline = _version(curs, schema, events_table)
        done: list[int] = []
        for migration in plan(steps, recorded, baseline_present=baseline):
            for statement in migration.statements:
                curs.execute(statement)
            if migration.seed is not None:
                curs.execute(*migration.seed())
            if migration.version == 0 and recorded is None and baseline:
                done += _record(curs, schema, baseline_versions(steps))  # its tables are the baseline's
            done += _record(curs, schema, [migration])
    return done


def check_schema(conn: Connection[Any], schema: str, events_table: str) -> None:
    """Raise ``SchemaNotReady`` unless the store's schema is the latest; changes nothing."""
    with conn.cursor(row_factory=tuple_row) as curs:
        recorded, baseline = _version(curs, schema, events_table)
    steps = migrations(schema, events_table)
    store = f"the PostgreSQL store {conn.info.dbname!r}"
    require_current(recorded, steps, baseline_present=baseline, store=store)


def _version(curs: Cursor[TupleRow], schema: str, events_table: str) -> tuple[int | None, bool]:
    """The highest recorded version (None: no version table), and whether the baseline's tables exist."""
    # an unversioned store with all of these is at the baseline; one missing any gets migration 1 run
    # (every statement of which leaves what exists as it is)
    snapshots = events_table.removesuffix("_events") + "_snapshots"
    tables = (events_table, snapshots, "baton_runs", "baton_submissions", "baton_blobs")
    curs.execute(
        "SELECT t, to_regclass(format('%%I.%%I', %s::text, t)) IS NOT NULL FROM unnest(%s::text[]) AS t",
        (schema, [*tables, VERSION_TABLE]),
    )
    found: dict[str, bool] = {name: bool(present) for name, present in curs.fetchall()}
    recorded = None
    if found[VERSION_TABLE]:
        curs.execute(
            SQL("SELECT coalesce(max(v), -1) FROM {0}.{1}").format(Identifier(schema), Identifier(VERSION_TABLE))
        )
        row = curs.fetchone()
        recorded = -1 if row is None else int(row[0])
    return recorded, all(found[t] for t in tables)


def _record(curs: Cursor[TupleRow], schema: str, done: list[Migration]) -> list[int]:
    statement = SQL("INSERT INTO {0}.{1} (v, name) VALUES (%s, %s)").format(
        Identifier(schema), Identifier(VERSION_TABLE)
    )
    curs.executemany(statement, [(m.version, m.name) for m in done])
    return [m.version for m in done]
