"""Versioned store schemas: ``baton store init`` applies the migrations a store lacks and records each;
a store made before versions were recorded is recognised and upgraded; a ledger never opens a store
whose schema is not the one it writes."""

from __future__ import annotations

import base64
import shutil
import sqlite3
import threading
from pathlib import Path

import pytest
from integration_support import LedgerFactory, RawStore, Submitter, intent, open_run

from baton.adapters.bootstrap import init_store, open_ledger, store_identity
from baton.adapters.clock import ManualClock
from baton.adapters.eventstore import RunLedger
from baton.adapters.eventstore.migrations import SchemaNotReady
from baton.adapters.eventstore.postgres_schema import migrations as postgres_migrations
from baton.adapters.eventstore.sqlite_schema import MIGRATIONS as SQLITE_MIGRATIONS
from baton.adapters.eventstore.store_identity import store_id_of
from baton.adapters.settings import StoreSettings

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "written-at-c914c1b" / "a.db"
OLD_RUNS = ("demo-d72d6583", "r1")  # the runs of the fixture store


def versions(store: RawStore) -> list[tuple[int, str]]:
    return [(int(v), str(name)) for v, name in store.query("SELECT v, name FROM baton_migrations ORDER BY v")]


def expected_versions(store: RawStore) -> list[tuple[int, str]]:
    if store.backend == "sqlite":
        return [(m.version, m.name) for m in SQLITE_MIGRATIONS]
    return [(m.version, m.name) for m in postgres_migrations("public", "batonledger_events")]


def test_init_records_every_migration_and_a_second_init_changes_nothing(
    store: RawStore, ledgers: LedgerFactory
) -> None:
    """Given an initialised store, then its version table lists every migration in order; when init runs
    again, then nothing is applied and a run appended before it is still there and verifies."""
    ledger = ledgers()
    assert open_run(ledger, "run-1").verdict == "accepted"
    listed = versions(store)

    init_store(store.url)

    assert listed == versions(store) == expected_versions(store)
    assert ledger.store.migrate() == []
    assert ledger.verify("run-1").events == 1


def test_concurrent_migrations_take_turns(store_url: str) -> None:
    """Given a new store, when four processes' recorders migrate it at once, then all succeed and each
    migration is recorded once."""
    failures: list[BaseException] = []

    def init() -> None:
        ledger = RunLedger(StoreSettings.resolve(store_url).env(create_table=False))
        try:
            ledger.store.migrate()
        except BaseException as exc:
            failures.append(exc)
        finally:
            ledger.close()

    threads = [threading.Thread(target=init) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    store = RawStore(store_url, "sqlite" if store_url.startswith("sqlite:") else "postgres")
    assert failures == []
    assert versions(store) == expected_versions(store)


def test_a_store_without_a_schema_is_refused_at_open_naming_store_init(store_url: str) -> None:
    """Given a store never initialised, when a ledger is opened on it, then it is refused with the command to run."""
    with pytest.raises(SchemaNotReady, match="baton store init"):
        open_ledger(store_url)


def test_a_store_migrated_by_a_newer_baton_is_refused_at_open_and_at_init(store: RawStore) -> None:
    """Given a store whose version table records a migration this Baton does not know, then neither a
    ledger nor init will touch it."""
    store.execute("INSERT INTO baton_migrations (v, name) VALUES (99, 'from the future')")

    with pytest.raises(SchemaNotReady, match="newer"):
        open_ledger(store.url)
    with pytest.raises(SchemaNotReady, match="newer"):
        init_store(store.url)


def test_an_old_sqlite_store_is_recognised_and_upgraded_without_rerunning_its_ddl(tmp_path: Path) -> None:
    """Given the store written at c914c1b (no version table), when a ledger opens it, then it is told to run
    init; when init runs, then versions 0 and 1 are recorded and 2 applied, its tables are left as they were
    beside the version table and the store's identity (one row, append-only), every run still verifies and a
    new run appends after the old ones."""
    path = tmp_path / "a.db"
    shutil.copy(FIXTURE, path)
    url = f"sqlite:///{path}"
    schema_before = _sqlite_schema(path)
    with pytest.raises(SchemaNotReady, match="version 1, this Baton needs 2"):
        open_ledger(url)

    init_store(url)

    store = RawStore(url, "sqlite")
    assert versions(store) == expected_versions(store)
    assert _sqlite_schema(path) - schema_before == {
        ("table", "baton_migrations"),
        ("table", "baton_store"),
        ("trigger", "baton_store_no_update"),
        ("trigger", "baton_store_no_delete"),
    }
    _identity_is_one_row_kept_as_it_is(store)
    _old_runs_verify_and_a_new_run_appends(url)


def _sqlite_schema(path: Path) -> set[tuple[str, str]]:
    with sqlite3.connect(path) as conn:
        return {(kind, name) for kind, name in conn.execute("SELECT type, name FROM sqlite_master")}


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_an_old_postgres_store_is_refused_until_init_upgrades_it(store_url: str) -> None:
    """Given a PostgreSQL store in the schema of c914c1b (no version table, notification ids stamped from
    transaction ids, its own baton_append) holding the fixture's runs, when a ledger opens it, then it is
    told to run init; after init, versions 0-4 are recorded, the old append functions are gone, the store
    has its identity, the old events keep their ids, and new events get larger ones, in order."""
    store = RawStore(store_url, "postgres")
    _old_postgres_store(store)
    old_ids = [row[0] for row in store.query("SELECT notification_id FROM batonledger_events ORDER BY 1")]

    with pytest.raises(SchemaNotReady, match="version 1, this Baton needs 4"):
        open_ledger(store_url)
    init_store(store_url)

    assert versions(store) == expected_versions(store)
    _identity_is_one_row_kept_as_it_is(store)
    assert store.query("SELECT count(*) FROM pg_proc WHERE proname = 'baton_append'") == [(0,)]
    assert store.query("SELECT count(*) FROM pg_proc WHERE proname = 'baton_fence'") == [(1,)]
    assert store.query("SELECT count(*) FROM pg_proc WHERE proname = 'baton_append_events'") == [(1,)]
    _old_runs_verify_and_a_new_run_appends(store_url)
    ids = [row[0] for row in store.query("SELECT notification_id FROM batonledger_events ORDER BY 1")]
    assert ids[: len(old_ids)] == old_ids and min(ids[len(old_ids) :]) > max(old_ids)


def test_a_store_gets_one_identity_and_keeps_it(store: RawStore) -> None:
    """Given an initialised store, then it has one identity whose id is its public key's; when init runs
    again, then the identity is the same; an UPDATE or DELETE of it is refused."""
    ((store_id, public_key),) = store.query("SELECT store_id, public_key FROM baton_store")
    raw = base64.b64decode(public_key.removeprefix("ed25519:"))
    assert (len(raw), store_id) == (32, store_id_of(raw))

    init_store(store.url)

    assert store_identity(store.url).public_key == public_key
    _identity_is_one_row_kept_as_it_is(store)


def _identity_is_one_row_kept_as_it_is(store: RawStore) -> None:
    ((count,),) = store.query("SELECT count(*) FROM baton_store")
    assert count == 1
    for statement in ("UPDATE baton_store SET public_key = 'x'", "DELETE FROM baton_store"):
        with pytest.raises(Exception, match="append-only"):
            store.execute(statement)


def _old_postgres_store(store: RawStore) -> None:
    """The schema version 1 describes, made without the version table, and the fixture's rows copied in
    with the notification ids that version stamped: ``(transaction id << 16) + ordinal``."""
    baseline = postgres_migrations("public", "batonledger_events")[1]
    with sqlite3.connect(FIXTURE) as old:
        events = old.execute(
            "SELECT originator_id, originator_version, topic, state, ((1000 + rowid) << 16) + 1 FROM stored_events"
        ).fetchall()
        runs = old.execute("SELECT * FROM baton_runs").fetchall()
        submissions = old.execute("SELECT * FROM baton_submissions").fetchall()
    with store.connect() as conn:
        for statement in baseline.statements:
            conn.execute(statement)
        conn.execute("CREATE FUNCTION baton_append(json, json, json, json, bytea[]) RETURNS void LANGUAGE sql AS ''")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO batonledger_events VALUES (%s, %s, %s, %s, %s)", events)
            cur.executemany("INSERT INTO baton_runs VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", runs)
            cur.executemany("INSERT INTO baton_submissions VALUES (%s, %s, %s, %s)", submissions)


def _old_runs_verify_and_a_new_run_appends(url: str) -> None:
    ledger = open_ledger(url, clock=ManualClock())
    try:
        heads = {run_id: ledger.verify(run_id).events for run_id in OLD_RUNS}
        assert all(heads.values())
        assert open_run(ledger, "new-run").verdict == "accepted"
        assert Submitter(ledger, "new-run", "w").acquire().verdict == "accepted"
        logged = [event.run_id for _, event in ledger.all_events()]
        assert logged[-2:] == ["new-run", "new-run"]
        assert len(logged) == sum(heads.values()) + 2
        assert ledger.verify("new-run").events == 2
        assert Submitter(ledger, "new-run", "w", epoch=1, prefix="w2").submit(intent("op-1")).position == 3
    finally:
        ledger.close()
