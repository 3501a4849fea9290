"""PostgreSQL appends through the library's transaction: run-row locks before its table lock, one global
lock order, riders in the same transaction, and what a lost connection or a bad text does."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest
from eventsourcing.persistence import DataError, OperationalError, ProgrammingError, StoredEvent
from eventsourcing.postgres import PostgresDatastore
from integration_support import LedgerFactory, RawStore, Submitter, intent, observation, open_run

from baton.adapters.bootstrap import open_ledger
from baton.adapters.clock import ManualClock
from baton.adapters.eventstore import RunLedger
from baton.adapters.eventstore.fenced import AppendConflict, FenceViolation, RunRow, SubmissionRow
from baton.adapters.eventstore.postgres_append import append_call, append_params
from baton.adapters.eventstore.postgres_recorder import FencedPostgresRecorder
from baton.adapters.eventstore.postgres_schema import APPEND_LOCK
from baton.domain.fencing import Fence

pytestmark = pytest.mark.parametrize("store_url", ["postgres"], indirect=True)

RUNS = [f"run-{k}" for k in range(6)]


def recorder(ledger: RunLedger) -> FencedPostgresRecorder:
    assert isinstance(ledger.recorder, FencedPostgresRecorder)
    return ledger.recorder


def leased_runs(ledger: RunLedger, worker: str = "A") -> dict[str, Submitter]:
    """Given the runs of ``RUNS``, open, each leased by ``worker`` at epoch 1."""
    submitters = {}
    for run_id in RUNS:
        assert open_run(ledger, run_id).verdict == "accepted"
        submitters[run_id] = Submitter(ledger, run_id, worker, prefix=f"{worker}-{run_id}")
        assert submitters[run_id].acquire(ttl_ms=600_000).verdict == "accepted"
    return submitters


def advancing(row: RunRow, events: int = 1) -> Fence:
    """The fence that moves ``row`` on by ``events`` events, nothing else changed."""
    return Fence(
        row.run_id, row.head, row.head_digest, row.epoch, row.holder, row.head + events, "sha256:next", row.epoch,
        row.holder, row.expires_at, row.stage, row.status,
    )  # fmt: skip


def opening(run_id: str, holder: str | None) -> Fence:
    return Fence(run_id, 0, "", 0, None, 1, "sha256:new", 1, holder, None, "GENERATING", "open")


def one_event(row: RunRow, sid: str) -> tuple[list[StoredEvent], list[SubmissionRow]]:
    position = row.head + 1
    return [StoredEvent(row.run_id, position, "domain.events:X", b"{}")], [
        SubmissionRow(sid, row.run_id, "c", position)
    ]


@pytest.mark.parametrize("opens_a_run", [False, True], ids=["advancing", "opening"])
def test_an_append_takes_the_append_lock_before_any_run_row(
    ledgers: LedgerFactory, store: RawStore, opens_a_run: bool
) -> None:
    """Given another transaction holding the append lock (as another append would), when an append starts
    (the one-statement path advancing a run, and the function path opening one), then it waits for that
    lock holding no run row yet, and completes once it is released: every append locks in one order."""
    ledger = ledgers()
    row = recorder(ledger).select_run(leased_runs(ledger)["run-0"].run_id)
    assert row is not None
    if opens_a_run:
        events = [StoredEvent("run-new", 1, "domain.events:X", b"{}")]
        kwargs = {"fences": [opening("run-new", "A")], "submissions": [SubmissionRow("s-1", "run-new", "c", 1)]}
    else:
        events, rows = one_event(row, "s-1")
        kwargs = {"fences": [advancing(row)], "submissions": rows}
    appending = threading.Thread(target=recorder(ledger).insert_events, args=(events,), kwargs=kwargs)
    with psycopg.connect(store.url) as holder:
        holder.execute(f"SELECT {APPEND_LOCK}")
        appending.start()
        try:
            _until_one_waits_for_the_append_lock(store)
            with psycopg.connect(store.url) as probe:  # the run row is free: NOWAIT would raise otherwise
                probe.execute("SELECT 1 FROM baton_runs WHERE run_id = 'run-0' FOR UPDATE NOWAIT")
        finally:
            holder.rollback()
            appending.join(timeout=30)
    assert store.event_count("run-new" if opens_a_run else "run-0") == (1 if opens_a_run else 3)


def test_an_append_holding_the_append_lock_goes_on_while_another_waits_for_it(
    ledgers: LedgerFactory, store: RawStore
) -> None:
    """Given a one-statement append waiting for the append lock (holding its tables' row-exclusive locks,
    as any statement does before it runs), when the holder of the lock appends events of its own, then it
    is not blocked by the waiter: no append takes a table lock after the append lock, so none deadlocks."""
    ledger = ledgers()
    row = recorder(ledger).select_run(leased_runs(ledger)["run-0"].run_id)
    assert row is not None
    events, rows = one_event(row, "s-1")
    waiting = threading.Thread(
        target=recorder(ledger).insert_events, args=(events,), kwargs={"fences": [advancing(row)], "submissions": rows}
    )
    opened = append_params(
        [opening("run-held", "A")], [SubmissionRow("s-held", "run-held", "c", 1)],
        [StoredEvent("run-held", 1, "domain.events:X", b"{}")], recorder(ledger).channel_name,
    )  # fmt: skip
    with psycopg.connect(store.url) as holder:
        holder.execute(f"SELECT {APPEND_LOCK}")
        waiting.start()
        try:
            _until_one_waits_for_the_append_lock(store)
            holder.execute("SET LOCAL lock_timeout = '500ms'")  # under deadlock_timeout: a wait fails here
            holder.execute(append_call("public"), opened)  # the function path, under the held lock
            holder.commit()
        finally:
            holder.rollback()
            waiting.join(timeout=30)
    assert (store.event_count("run-held"), store.event_count("run-0")) == (1, 3)


def _until_one_waits_for_the_append_lock(store: RawStore) -> None:
    deadline = time.monotonic() + 10
    while not _waits_for_advisory_lock(store) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _waits_for_advisory_lock(store)


def _waits_for_advisory_lock(store: RawStore) -> bool:
    rows = store.query("SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'advisory'", ())
    return bool(rows[0][0])


SLEEPING_HERE = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND datname = current_database()"


def test_an_append_opening_a_run_that_another_is_opening_and_advancing_does_not_deadlock(
    ledgers: LedgerFactory, store: RawStore
) -> None:
    """Given run-1 exists, when T1 opens k1 and run-1 (a racing open of run-1) while T2 advances run-1 and
    opens k1, then T1 fails on run-1's key and T2 commits: both take run rows in run id order, so neither
    waits on the other in a cycle. (A trigger sleeps as T1 reaches run-1, only to widen the window.)"""
    ledger = ledgers()
    row = recorder(ledger).select_run(leased_runs(ledger)["run-1"].run_id)
    assert row is not None
    store.execute(
        "CREATE FUNCTION slow_open() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.run_id = 'run-1' THEN PERFORM pg_sleep(0.5); END IF; RETURN NEW; END $$",
        "CREATE TRIGGER slow_open BEFORE INSERT ON baton_runs FOR EACH ROW EXECUTE FUNCTION slow_open()",
    )
    appends = {
        "T1": ([opening("k1", None), opening("run-1", None)], [("t1-k1", "k1", 1), ("t1-k2", "run-1", 1)]),
        "T2": ([advancing(row), opening("k1", "w2")], [("t2-k2", "run-1", row.head + 1), ("t2-k1", "k1", 1)]),
    }
    deadlocks_before = _deadlocks(store)
    outcomes: dict[str, str] = {}

    def t1_sleeps_in_the_trigger() -> bool:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if store.query(SLEEPING_HERE) == [(1,)]:
                return True
            time.sleep(0.01)
        return False

    def append(name: str, start_when: Callable[[], bool]) -> None:
        fences, keys = appends[name]
        rows = [SubmissionRow(sid, run_id, "sha256:c", position) for sid, run_id, position in keys]
        events = [StoredEvent(run_id, position, "domain.events:X", b"{}") for _, run_id, position in keys]
        if not start_when():
            outcomes[name] = "never started"
            return
        try:
            recorder(ledger).insert_events(events, fences=fences, submissions=rows)
            outcomes[name] = "committed"
        except AppendConflict as exc:
            outcomes[name] = f"conflict: {exc}"

    threads = [
        threading.Thread(target=append, args=("T1", lambda: True)),
        threading.Thread(target=append, args=("T2", t1_sleeps_in_the_trigger)),  # T1 holds k1 by then
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert outcomes["T2"] == "committed"
    assert outcomes["T1"].startswith("conflict:") and "Key (run_id)=(run-1) already exists" in outcomes["T1"]
    assert _deadlocks(store) == deadlocks_before
    assert store.query("SELECT holder FROM baton_runs WHERE run_id = 'k1'") == [("w2",)]


def _deadlocks(store: RawStore) -> int:
    return int(store.query("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")[0][0])


def test_two_fences_for_one_run_in_one_append_are_refused_before_the_store(ledgers: LedgerFactory) -> None:
    """Given an append carrying two fences for one run, then it is refused with a clear error and nothing is sent."""
    ledger = ledgers()
    fence = Fence("run-0", 1, "sha256:a", 1, "A", 2, "sha256:b", 1, "A", None, "GENERATING", "open")

    with pytest.raises(ValueError, match="one fence per run"):
        recorder(ledger).insert_events([], fences=[fence, fence], submissions=[])


def test_a_rider_commits_with_its_append_and_is_rolled_back_with_a_refused_one(
    ledgers: LedgerFactory, store: RawStore
) -> None:
    """Given a side table, when an append rides an insert into it, then the row is stored with the append;
    when a stale append rides another, then neither is stored; a rider's own error is raised as it is."""
    ledger = ledgers()
    row = recorder(ledger).select_run(leased_runs(ledger)["run-0"].run_id)
    assert row is not None
    store.execute("CREATE TABLE side (k text PRIMARY KEY)")
    events, rows = one_event(row, "s-1")
    stale_events, _ = one_event(row, "s-2")  # decided on the row before the first append

    with recorder(ledger).riding("side_row AS (INSERT INTO side VALUES (%s))", ["with-append"]):
        recorder(ledger).insert_events(events, fences=[advancing(row)], submissions=rows)
    with (
        recorder(ledger).riding("side_row AS (INSERT INTO side VALUES (%s))", ["with-stale"]),
        pytest.raises(FenceViolation),
    ):
        recorder(ledger).insert_events(stale_events, fences=[advancing(row)], submissions=[])
    with (
        recorder(ledger).riding("extra AS (SELECT no_such_function())", []),
        pytest.raises(ProgrammingError, match="no_such_function"),
    ):
        recorder(ledger).insert_events([], fences=[], submissions=[])

    assert store.query("SELECT k FROM side") == [("with-append",)]
    assert store.event_count("run-0") == 3


def _other_backends(store: RawStore) -> int:
    """How many client connections to the store's database there are, besides the one asking."""
    rows = store.query(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND backend_type = 'client backend'"
    )
    return int(rows[0][0])


def test_an_append_after_the_server_dropped_the_ledgers_connections_goes_through_once(
    ledgers: LedgerFactory, store: RawStore
) -> None:
    """Given a leased run with an intent appended, when the server terminates every connection of the
    ledger, then the next intent is accepted at the next position, on a new connection, stored once,
    and the chain verifies."""
    ledger = ledgers()
    worker = leased_runs(ledger)["run-0"]
    assert worker.submit(intent("op-1")).position == 3
    store.query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
    )

    verdict = worker.submit(observation("op-1"))

    assert (verdict.verdict, verdict.position) == ("accepted", 4)
    assert store.event_count(worker.run_id) == 4
    assert ledger.verify(worker.run_id).events == 4


def test_closing_a_ledger_leaves_no_connection_of_it(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given a ledger that has appended, when it is closed, then no connection of it is left on the server."""
    ledger = ledgers()
    worker = leased_runs(ledger)["run-0"]
    assert worker.submit(intent("op-1")).verdict == "accepted"
    assert _other_backends(store) >= 1

    ledger.close()

    deadline = time.monotonic() + 10
    while _other_backends(store) and time.monotonic() < deadline:
        time.sleep(0.05)  # a backend leaves pg_stat_activity a moment after its client closes
    assert _other_backends(store) == 0


def test_a_ledger_that_fails_to_build_leaves_no_connection_of_it(
    store: RawStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a one-shot ledger whose pool's first wait runs out while its connection is being made (a loaded
    host), when ``open_ledger`` builds another and that one is closed, then no connection of either is left."""
    register = PostgresDatastore.register_type_adapters
    failures = [OperationalError("couldn't get a connection after 1.00 sec")]

    def slow_first(datastore: PostgresDatastore) -> None:
        if failures:
            datastore.pool.open(wait=True)  # the connection the wait gave up on arrives in the pool
            raise failures.pop()
        register(datastore)

    monkeypatch.setattr(PostgresDatastore, "register_type_adapters", slow_first)
    open_ledger(store.url, one_shot=True).close()
    assert not failures

    deadline = time.monotonic() + 10
    while _other_backends(store) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _other_backends(store) == 0


def test_an_append_with_a_nul_in_a_text_is_refused_and_stores_nothing(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given a leased run, when the recorder is handed an append whose submission id holds a NUL (the domain
    refuses such ids; this is psycopg's guard), then it raises a data error and stores nothing."""
    ledger = ledgers()
    assert leased_runs(ledger)["run-0"].submit(intent("op-1")).position == 3
    row = recorder(ledger).select_run("run-0")
    assert row is not None
    events, _ = one_event(row, "unused")

    with pytest.raises(DataError):
        recorder(ledger).insert_events(
            events, fences=[advancing(row)], submissions=[SubmissionRow("s-\x00cut", "run-0", "c", row.head + 1)]
        )

    assert store.event_count("run-0") == 3
    assert store.query("SELECT count(*) FROM baton_submissions WHERE submission_id LIKE ?", ("s-%",)) == [(0,)]


def test_a_ledger_on_a_pool_of_one_appends_and_reads(store: RawStore) -> None:
    """Given a ledger on a pool of at most one connection (``?pool_size=1&max_overflow=0``), when it
    appends and then reads, then both go through."""
    ledger = open_ledger(store.url + "&pool_size=1&max_overflow=0", clock=ManualClock())
    try:
        worker = leased_runs(ledger)["run-0"]
        assert worker.submit(intent("op-1")).position == 3

        assert ledger.state(worker.run_id).version == 3  # folds from the store: a read
        assert ledger.verify(worker.run_id).events == 3
    finally:
        ledger.close()


def test_notification_ids_follow_commit_order_across_runs(ledgers: LedgerFactory) -> None:
    """Given appends to several runs, then the global log lists every event once, in increasing ids."""
    ledger = ledgers()
    workers = leased_runs(ledger)
    for run_id, worker in workers.items():
        assert worker.submit(intent(f"op-{run_id}")).verdict == "accepted"

    ids = [notification_id for notification_id, _ in ledger.all_events(page=4)]

    assert ids == sorted(ids) and len(set(ids)) == len(ids) == 3 * len(RUNS)
