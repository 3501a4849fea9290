"""PostgreSQL's set-based ``baton_append``: a store made before it gets it in place, and its lock order."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from eventsourcing.persistence import DataError, ProgrammingError, StoredEvent
from integration_support import LedgerFactory, RawStore, Submitter, intent, open_run

from baton.adapters.bootstrap import open_ledger
from baton.adapters.clock import ManualClock
from baton.adapters.eventstore import RunLedger
from baton.adapters.eventstore.fenced import SubmissionRow
from baton.domain.fencing import Fence

pytestmark = pytest.mark.parametrize("store_url", ["postgres"], indirect=True)

RUNS = [f"run-{k}" for k in range(6)]


def leased_runs(ledger: RunLedger, worker: str = "A") -> dict[str, Submitter]:
    """Given the runs of ``RUNS``, open, each leased by ``worker`` at epoch 1."""
    submitters = {}
    for run_id in RUNS:
        assert open_run(ledger, run_id).verdict == "accepted"
        submitters[run_id] = Submitter(ledger, run_id, worker, prefix=f"{worker}-{run_id}")
        assert submitters[run_id].acquire(ttl_ms=600_000).verdict == "accepted"
    return submitters


def test_a_store_without_this_baton_append_gets_it_at_the_first_batch(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given a store whose baton_append predates this version (dropped here), when a batch is
    submitted, then the function is created in place and the batch is accepted in one append."""
    ledger = ledgers()
    workers = leased_runs(ledger)
    store.execute("DROP FUNCTION baton_append(json, json, json, json, bytea[])")

    verdicts = ledger.submit_many([w.submission(intent(f"op-{run_id}")) for run_id, w in workers.items()])

    assert [v.verdict for v in verdicts] == ["accepted"] * len(RUNS)
    assert store.query("SELECT count(*) FROM pg_proc WHERE proname = 'baton_append'") == [(1,)]
    for run_id in RUNS:
        assert store.event_count(run_id) == 3
        ledger.verify(run_id)


SLEEPING_HERE = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND datname = current_database()"


def test_an_append_opening_a_run_that_another_is_opening_and_advancing_does_not_deadlock(
    ledgers: LedgerFactory, store: RawStore
) -> None:
    """Given run k2 exists, when T1 opens k1 and k2 (a racing open of k2) while T2 advances k2 and
    opens k1, then T1 fails on k2's key and T2 commits: rows are taken new runs first, so neither
    waits on the other in a cycle. (A trigger sleeps as T1 reaches k2, only to widen the window.)"""
    ledger = ledgers()
    k2 = leased_runs(ledger)["run-1"]
    row = ledger.recorder.select_run(k2.run_id)  # type: ignore[attr-defined]
    store.execute(
        "CREATE FUNCTION slow_open() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.run_id = 'run-1' THEN PERFORM pg_sleep(0.5); END IF; RETURN NEW; END $$",
        "CREATE TRIGGER slow_open BEFORE INSERT ON baton_runs FOR EACH ROW EXECUTE FUNCTION slow_open()",
    )

    def opening(run_id: str, holder: str | None) -> Fence:
        return Fence(run_id, 0, "", 0, None, 1, "sha256:new", 1, holder, None, "GENERATING", "open")

    advance = Fence(
        row.run_id,
        row.head,
        row.head_digest,
        row.epoch,
        row.holder,
        row.head + 1,
        "sha256:next",
        row.epoch,
        row.holder,
        row.expires_at,
        row.stage,
        row.status,
    )
    appends = {
        "T1": ([opening("k1", None), opening("run-1", None)], [("t1-k1", "k1", 1), ("t1-k2", "run-1", 1)]),
        "T2": ([advance, opening("k1", "w2")], [("t2-k2", "run-1", row.head + 1), ("t2-k1", "k1", 1)]),
    }
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
        statement, params, _ = ledger.recorder.append_query(fences, rows, events)  # type: ignore[attr-defined]
        if not start_when():
            outcomes[name] = "never started"
            return
        try:
            with psycopg.connect(store.url, autocommit=True) as conn:
                conn.execute(statement, params)
            outcomes[name] = "committed"
        except psycopg.Error as exc:
            outcomes[name] = f"{exc.sqlstate} {exc.diag.constraint_name} {exc.diag.message_detail}"

    threads = [
        threading.Thread(target=append, args=("T1", lambda: True)),
        threading.Thread(target=append, args=("T2", t1_sleeps_in_the_trigger)),  # T1 holds k1 by then
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    # T1 failed on run-1's key, as it reached it (not on k1's, which T2 would have had to commit
    # first); 40P01 would be a deadlock
    assert outcomes == {
        "T1": "23505 baton_runs_pkey Key (run_id)=(run-1) already exists.",
        "T2": "committed",
    }
    assert store.query("SELECT holder FROM baton_runs WHERE run_id = 'k1'") == [("w2",)]


def test_two_fences_for_one_run_in_one_append_are_refused_before_the_store(ledgers: LedgerFactory) -> None:
    """Given the set-based append (one compare-and-set per run), when an append carries two fences
    for one run, then it is refused with a clear error before anything reaches the store."""
    ledger = ledgers()
    fence = Fence("run-0", 1, "sha256:a", 1, "A", 2, "sha256:b", 1, "A", None, "GENERATING", "open")

    with pytest.raises(ValueError, match="one fence per run"):
        ledger.recorder.append_query([fence, fence], [], [])  # type: ignore[attr-defined]


def test_a_riders_missing_function_is_its_own_error_not_an_upgrade(
    ledgers: LedgerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a rider calling a function the store lacks, when a batch appends with it, then that
    error is raised as it is and no upgrade of baton_append is attempted."""
    ledger = ledgers()
    workers = leased_runs(ledger)
    batch = [w.submission(intent(f"op-{run_id}")) for run_id, w in workers.items()]
    upgrades: list[object] = []
    monkeypatch.setattr(ledger.recorder, "_install_append_function", upgrades.append)

    with (
        ledger.recorder.riding("extra AS (SELECT no_such_function())", []),  # type: ignore[attr-defined]
        pytest.raises(ProgrammingError, match="no_such_function"),
    ):
        ledger.recorder.insert_events([], fences=[], submissions=[])
    verdicts = ledger.submit_many(batch)  # the same ledger, without the rider, still appends

    assert upgrades == []
    assert [v.verdict for v in verdicts] == ["accepted"] * len(RUNS)


def test_a_role_that_cannot_create_functions_is_told_to_run_store_init(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given a store whose baton_append predates this version and a ledger whose role may write rows
    but not create functions, when it appends a batch, then it is told to run ``baton store init``
    and nothing is stored."""
    owner = ledgers()
    workers = leased_runs(owner)
    store.execute(
        "DROP FUNCTION baton_append(json, json, json, json, bytea[])",
        "DROP ROLE IF EXISTS baton_writer",
        "CREATE ROLE baton_writer LOGIN",
        "GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO baton_writer",
    )
    parts = urlsplit(store.url)
    writer = open_ledger(urlunsplit(parts._replace(netloc=f"baton_writer@{parts.hostname or ''}")), clock=ManualClock())
    try:
        batch = [w.submission(intent(f"op-{run_id}")) for run_id, w in workers.items()]
        with pytest.raises(ProgrammingError, match="run `baton store init` as its owner"):
            writer.submit_many(batch)
    finally:
        writer.close()
    assert {store.event_count(run_id) for run_id in RUNS} == {2}
    assert not {s.submission_id for s in batch} & store.submission_ids()


def _other_backends(store: RawStore) -> int:
    """How many client connections to the store's database there are, besides the one asking."""
    rows = store.query(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND backend_type = 'client backend'"
    )
    return int(rows[0][0])


def _kept(ledger: RunLedger) -> Any:
    """The ledger's connection kept for appends (white box: what psycopg or an interrupt can do to it)."""
    return ledger.recorder._kept  # type: ignore[attr-defined]


def test_an_append_after_the_server_dropped_the_ledgers_connections_goes_through_once(
    ledgers: LedgerFactory, store: RawStore
) -> None:
    """Given a leased run with an intent appended (so the ledger keeps a connection for appends),
    when the server terminates every connection of the ledger, then the next intent is accepted
    at the next position, on a new connection, stored once, and the chain verifies."""
    ledger = ledgers()
    worker = leased_runs(ledger)["run-0"]
    assert worker.submit(intent("op-1")).position == 3
    store.query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
    )

    verdict = worker.submit(intent("op-2"))

    assert (verdict.verdict, verdict.position) == ("accepted", 4)
    assert store.event_count(worker.run_id) == 4
    assert ledger.verify(worker.run_id).events == 4


def test_closing_a_ledger_closes_the_connection_it_kept_for_appends(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given a ledger that has appended (and so keeps a connection checked out of its pool), when
    it is closed, then no connection of it is left on the server."""
    ledger = ledgers()
    worker = leased_runs(ledger)["run-0"]
    assert worker.submit(intent("op-1")).verdict == "accepted"
    assert _other_backends(store) >= 1

    ledger.close()

    deadline = time.monotonic() + 10
    while _other_backends(store) and time.monotonic() < deadline:
        time.sleep(0.05)  # a backend leaves pg_stat_activity a moment after its client closes
    assert _other_backends(store) == 0


def test_a_single_event_append_with_a_nul_in_a_text_is_refused_not_cut_short(
    ledgers: LedgerFactory, store: RawStore
) -> None:
    """Given a leased run, when the recorder is handed a one-event append whose submission id holds
    a NUL (the domain refuses such ids; this is the recorder's own guard), then it raises a data
    error and stores nothing: libpq would have cut the id at the NUL and stored the rest."""
    ledger = ledgers()
    assert leased_runs(ledger)["run-0"].submit(intent("op-1")).position == 3
    row = ledger.recorder.select_run("run-0")  # type: ignore[attr-defined]
    fence = Fence(
        "run-0", row.head, row.head_digest, row.epoch, row.holder, row.head + 1, "sha256:next", row.epoch,
        row.holder, row.expires_at, row.stage, row.status,
    )  # fmt: skip

    with pytest.raises(DataError):
        ledger.recorder.insert_events(  # type: ignore[attr-defined]
            [StoredEvent("run-0", row.head + 1, "domain.events:X", b"{}")],
            fences=[fence],
            submissions=[SubmissionRow("s-\x00cut", "run-0", "sha256:c", row.head + 1)],
        )

    assert store.event_count("run-0") == 3
    assert store.query("SELECT count(*) FROM baton_submissions WHERE submission_id LIKE ?", ("s-%",)) == [(0,)]


def test_a_submission_while_another_thread_appends_on_the_kept_connection_goes_through_the_pool(
    ledgers: LedgerFactory, store: RawStore
) -> None:
    """Given a ledger whose kept connection is in use (its lock held, as by another thread's
    append), when a submission arrives, then it is appended on a pooled connection instead of
    waiting: accepted at the next position, and the chain verifies."""
    ledger = ledgers()
    worker = leased_runs(ledger)["run-0"]
    assert worker.submit(intent("op-1")).position == 3

    with _kept(ledger).lock:
        verdict = worker.submit(intent("op-2"))

    assert (verdict.verdict, verdict.position) == ("accepted", 4)
    assert ledger.verify(worker.run_id).events == store.event_count(worker.run_id) == 4


@pytest.mark.parametrize("mishap", ["deallocated", "prepared_unnoted"])
def test_the_one_event_append_survives_its_prepared_statement_dropped_or_prepared_unnoted(
    ledgers: LedgerFactory, store: RawStore, mishap: str
) -> None:
    """Given a ledger that has appended once (the one-event statement prepared on its kept
    connection), when the statement is dropped behind its back (psycopg sends DEALLOCATE ALL
    after a rollback on a connection with its own prepared statements) or its preparation was
    never noted (an interrupt between preparing and noting it), then the next intent is still
    accepted at the next position and stored once."""
    ledger = ledgers()
    worker = leased_runs(ledger)["run-0"]
    assert worker.submit(intent("op-1")).position == 3
    conn = _kept(ledger).take()
    if mishap == "deallocated":
        conn.execute("DEALLOCATE ALL")
    else:
        del conn._baton_append_one_prepared

    verdict = worker.submit(intent("op-2"))

    assert (verdict.verdict, verdict.position) == ("accepted", 4)
    assert ledger.verify(worker.run_id).events == store.event_count(worker.run_id) == 4


def test_a_ledger_on_a_pool_of_one_keeps_no_connection_and_still_reads(store: RawStore) -> None:
    """Given a ledger on a pool of at most one connection (``?pool_size=1&max_overflow=0``), when
    it appends and then reads, then both go through: it keeps no connection for appends, which
    would leave none for the reads."""
    ledger = open_ledger(store.url + "&pool_size=1&max_overflow=0", clock=ManualClock())
    try:
        worker = leased_runs(ledger)["run-0"]
        assert worker.submit(intent("op-1")).position == 3

        assert ledger.state(worker.run_id).version == 3  # folds from the store: a read
        assert ledger.verify(worker.run_id).events == 3
        assert _kept(ledger) is None
    finally:
        ledger.close()
