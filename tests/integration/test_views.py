"""Materialised views (``run_state``, ``budget_usage``): exactly once, never skipping, on both stores.

The reference is always the pure folds over the whole log (``views_support.expected_views``),
computed without any view code. The restart test kills a view-runner process with SIGKILL while
its batch transaction is open (held on a table lock the test takes), with writer processes still
appending, and checks that the restarted runner ends exactly where a rebuild from scratch does.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.process import BaseProcess

import psycopg
import pytest
from integration_support import RawStore
from views_support import (
    VIEW_RUNNER_APP,
    expected_views,
    follow_views,
    read_views,
    tracking,
    write_runs,
)

from baton.adapters.bootstrap import open_ledger, open_views
from baton.adapters.cli import main
from baton.adapters.views import CatchUp, ViewRunner
from baton.adapters.views.tables import StaleBatch
from baton.domain.events import RecordedEvent

LEDGER = "BatonLedger"


@pytest.fixture
def views(store: RawStore) -> Iterator[Callable[..., ViewRunner]]:
    """Opens view runners on ``store``; closes them after the test."""
    opened: list[ViewRunner] = []

    def factory(batch_size: int = 7) -> ViewRunner:
        runner = open_views(store.url, batch_size=batch_size)
        opened.append(runner)
        return runner

    yield factory
    for runner in opened:
        runner.close()


def the_log(store: RawStore) -> tuple[list[RecordedEvent], int]:
    """Every event of the store in notification order, and the last notification id."""
    ledger = open_ledger(store.url)
    try:
        pairs = list(ledger.all_events())
    finally:
        ledger.close()
    return [event for _, event in pairs], pairs[-1][0] if pairs else 0


def test_catch_up_equals_the_pure_folds(store: RawStore, views: Callable[..., ViewRunner]) -> None:
    """Given runs by several workers, when the views catch up in small batches, then they equal the pure folds."""
    write_runs(store.url, ["run-1", "run-2", "run-3", "run-4"], steps=160, seed=1)
    events, last_id = the_log(store)

    done = views(batch_size=7).catch_up()

    assert (done.events, done.position) == (len(events), last_id)
    runs, budget = read_views(store)
    assert (runs, budget) == expected_views(events)
    assert tracking(store)[LEDGER] == last_id
    assert {"run", "worker", "model", "provider", "day"} == {dimension for dimension, _ in budget}
    assert len({row[5] for row in runs.values()}) >= 2, "the histories should reach several classes"


def test_catching_up_again_changes_nothing(store: RawStore, views: Callable[..., ViewRunner]) -> None:
    """Given caught-up views, when catch-up runs again with no new events, then no row and no tracking id changes."""
    write_runs(store.url, ["run-1", "run-2"], steps=60, seed=2)
    runner = views()
    runner.catch_up()
    before = (read_views(store), tracking(store), store.query("SELECT run_id, position, state FROM view_run_fold"))

    again = runner.catch_up()

    assert (again.events, again.batches) == (0, 0)
    assert (
        read_views(store),
        tracking(store),
        store.query("SELECT run_id, position, state FROM view_run_fold"),
    ) == before


def test_rebuild_equals_the_incremental_views(store: RawStore, views: Callable[..., ViewRunner]) -> None:
    """Given views caught up in rounds between appends, when they are rebuilt from scratch, then nothing differs."""
    runner = views(batch_size=5)
    for round_, runs in enumerate([["a", "b"], ["b", "c"], ["a", "c", "d"]]):
        write_runs(store.url, [f"{run}-{round_}" for run in runs], steps=40, seed=10 + round_)
        runner.catch_up()
    incremental = read_views(store)
    folds = store.query("SELECT run_id, position, state FROM view_run_fold ORDER BY run_id")

    rebuilt = runner.rebuild()

    events, last_id = the_log(store)
    assert (rebuilt.events, rebuilt.position) == (len(events), last_id)
    assert read_views(store) == incremental == expected_views(events)
    assert store.query("SELECT run_id, position, state FROM view_run_fold ORDER BY run_id") == folds
    assert tracking(store).keys() == {LEDGER, "__migration__"}, "the rebuild's tracking row was swapped in"
    with pytest.raises(Exception, match="run_state__next"):
        store.query("SELECT 1 FROM run_state__next")


def test_a_batch_read_from_a_stale_position_changes_nothing(store: RawStore, views: Callable[..., ViewRunner]) -> None:
    """Given caught-up views, when a batch read from an older position arrives, then it is refused, changing nothing."""
    write_runs(store.url, ["run-1"], steps=30, seed=3)
    runner = views()
    runner.catch_up()
    before = (read_views(store), tracking(store))
    ledger = open_ledger(store.url)
    try:
        replay = list(ledger.all_events())[:5]
    finally:
        ledger.close()

    with pytest.raises(StaleBatch):
        runner.store.apply_batch(runner.live, 0, replay)

    assert (read_views(store), tracking(store)) == before


def test_two_runners_racing_apply_every_event_once(store: RawStore, views: Callable[..., ViewRunner]) -> None:
    """Given two runners catching up the same views at once, when both finish, then the views equal the pure folds."""
    write_runs(store.url, ["run-1", "run-2", "run-3"], steps=150, seed=4)
    runners = [views(batch_size=3), views(batch_size=4)]
    results: list[CatchUp | BaseException | None] = [None, None]

    def catch_up(i: int) -> None:
        try:
            results[i] = runners[i].catch_up()
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=catch_up, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    events, last_id = the_log(store)
    assert read_views(store) == expected_views(events)
    assert tracking(store)[LEDGER] == last_id
    done = [result for result in results if isinstance(result, CatchUp)]
    assert len(done) == 2, results
    assert sum(result.events for result in done) == len(events), "each event was applied by exactly one runner"


def test_the_cli_catches_up_and_rebuilds_with_a_progress_line(
    store: RawStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """Given a store with events, when `views catch-up` and `views rebuild` run, then they print counts and progress."""
    write_runs(store.url, ["run-1", "run-2"], steps=50, seed=5)
    events, _ = the_log(store)

    assert main(["views", "catch-up", "--store", store.url]) == 0
    caught_up = capsys.readouterr()
    assert main(["views", "rebuild", "--store", store.url]) == 0
    rebuilt = capsys.readouterr()

    assert f"{len(events)} events" in caught_up.out
    assert "run_state 2 rows" in caught_up.out
    assert f"{len(events)} events" in rebuilt.out
    assert "ev/s" in rebuilt.err and "\r" in rebuilt.err
    assert read_views(store) == expected_views(events)


# -- the restart test: real PostgreSQL, real processes, SIGKILL mid-transaction -------------------

WRITERS = 3
RUNS_PER_WRITER = 2
MAX_STEPS = 20_000  # a cap: the writers run until the test stops them


def _wait_for(
    condition: Callable[[], bool], what: str, *, alive: Sequence[BaseProcess] = (), timeout: float = 20.0
) -> None:
    """Poll ``condition``; fail on timeout, or as soon as one of the ``alive`` processes has died."""
    deadline = time.monotonic() + timeout
    while not condition():
        dead = [process.name for process in alive if not process.is_alive()]
        if dead:
            pytest.fail(f"{', '.join(dead)} exited before {what}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting until {what}")
        time.sleep(0.01)


def _folded(store: RawStore) -> int:
    return store.query("SELECT coalesce(sum(position), 0) FROM run_state")[0][0]


def _runner_waiting_on_a_lock(conn: psycopg.Connection) -> tuple[int, str | None] | None:
    """The runner's session blocked on a lock inside a transaction that has written (has an xid)."""
    row = conn.execute(
        "SELECT pid, backend_xid::text FROM pg_stat_activity WHERE application_name = %s "
        "AND wait_event_type = 'Lock' AND xact_start IS NOT NULL",
        (VIEW_RUNNER_APP,),
    ).fetchone()
    return None if row is None else (row[0], row[1])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_a_runner_killed_mid_batch_and_restarted_neither_skips_nor_double_counts(store: RawStore) -> None:
    """Given writers appending in other processes, when the view runner is SIGKILLed inside a batch and restarted,
    then the views end equal to a rebuild from scratch and to the pure folds."""
    postgres_url = store.url
    open_views(postgres_url).close()  # create the view tables once, before any runner starts
    ctx = multiprocessing.get_context("spawn")
    stop_writers, stop_runner = ctx.Event(), ctx.Event()
    started = [ctx.Event() for _ in range(WRITERS)]
    writers = [
        ctx.Process(
            target=write_runs,
            args=(
                postgres_url,
                [f"w{i}-r{j}" for j in range(RUNS_PER_WRITER)],
                MAX_STEPS,
                100 + i,
                stop_writers,
                started[i],
            ),
        )
        for i in range(WRITERS)
    ]
    first = ctx.Process(target=follow_views, args=(postgres_url, stop_runner, 10), name="the first runner")
    second = ctx.Process(target=follow_views, args=(postgres_url, stop_runner, 10), name="the restarted runner")
    processes = [*writers, first, second]
    try:
        for process in [*writers, first]:
            process.start()
        _wait_for(lambda: all(event.is_set() for event in started), "every writer is appending", alive=writers)
        _wait_for(lambda: _folded(store) >= 60, "the first runner has folded some events", alive=[first])

        # Hold the runner's tracking update, the last statement of a batch: when it blocks here its
        # transaction has locked the tracking row and written every view row of the batch.
        with psycopg.connect(postgres_url) as blocker:
            blocker.execute("LOCK TABLE batonviews_tracking IN SHARE MODE")
            with psycopg.connect(postgres_url, autocommit=True) as watcher:
                _wait_for(
                    lambda: _runner_waiting_on_a_lock(watcher) is not None,
                    "the runner blocks in a batch",
                    alive=[first],
                )
                _, xid = _runner_waiting_on_a_lock(watcher) or (0, None)
                assert xid is not None, "the blocked transaction has written rows"
                folded_before_kill = _folded(store)
                os.kill(first.pid, signal.SIGKILL)
                first.join(timeout=10)
            blocker.rollback()  # releases the lock; the dead session's transaction rolls back
        assert first.exitcode == -signal.SIGKILL
        assert all(writer.is_alive() for writer in writers), "the writers are still appending"

        second.start()
        _wait_for(
            lambda: _folded(store) > folded_before_kill + 30, "the restarted runner makes progress", alive=[second]
        )
        stop_writers.set()
        for writer in writers:
            writer.join(timeout=60)
        assert [writer.exitcode for writer in writers] == [0] * WRITERS
        stop_runner.set()
        second.join(timeout=60)
        assert second.exitcode == 0
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=5)

    events, last_id = the_log(store)
    incremental = read_views(store)
    assert tracking(store)[LEDGER] == last_id
    assert incremental == expected_views(events)
    with open_views(postgres_url, batch_size=500) as runner:
        assert runner.rebuild().events == len(events)
    assert read_views(store) == incremental
