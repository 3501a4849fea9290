"""The store contract: one body per behaviour, run against SQLite and PostgreSQL alike.

Each test is given/when/then over a real store: given these prior submissions, when this one
arrives, then these verdicts, these stored events, and nothing else in the tables.
"""

from __future__ import annotations

import gc
import itertools
import sqlite3
import threading
from typing import Any

import msgspec
import psycopg
import pytest
from eventsourcing.persistence import OperationalError
from integration_support import (
    T0,
    TASK,
    LedgerFactory,
    RawStore,
    Submitter,
    intent,
    observation,
    open_run,
    positions,
)

from baton.adapters.bootstrap import init_store
from baton.adapters.clock import ManualClock
from baton.adapters.eventstore import RunLedger, content_digest
from baton.adapters.eventstore import write_path as ledger_module
from baton.adapters.eventstore.fenced import FenceViolation
from baton.domain.budgets import Ceilings
from baton.domain.commands import (
    OpenRun,
    RecordObservation,
    RecordTransition,
    RenewLease,
    ReserveStage,
    Submission,
    Verdict,
)
from baton.domain.decide import context_digest
from baton.domain.errors import StoreUnavailable
from baton.domain.events import ObservationRecorded
from baton.domain.stages import Stage
from baton.domain.state import intended_ops

RUN = "run-1"
STATE_DIGEST = "sha256:" + "cd" * 32
AN_HOUR_LATER = T0 + 3_600_000_000


def leased_run(ledger: Any, worker: str = "A", *, ttl_ms: int = 30_000, **open_kwargs: Any) -> Submitter:
    """Given an open run (position 1) whose lease ``worker`` holds at epoch 1 (position 2)."""
    assert open_run(ledger, RUN, **open_kwargs).verdict == "accepted"
    submitter = Submitter(ledger, RUN, worker)
    assert submitter.acquire(ttl_ms=ttl_ms).position == 2
    assert submitter.epoch == 1
    return submitter


def by_position(verdict: Verdict) -> int:
    return verdict.position or 0


def accepted_positions(verdicts: list[Verdict]) -> list[int]:
    return [v.position for v in verdicts if v.verdict == "accepted" and v.position is not None]


def test_round_trip_is_contiguous_and_verifies(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given a leased run, when intent, observation and transition are recorded, then history is 1..5 and verifies."""
    ledger = ledgers()
    worker = leased_run(ledger)
    command = intent("op-1", kind="effect", path="/srv/app.py")

    at_intent = worker.submit(command)
    at_observation = worker.submit(
        RecordObservation("op-1", context_digest(command.context), "ok", result={"bytes_written": 42})
    )
    at_transition = worker.submit(RecordTransition(Stage.CANDIDATE_READY, STATE_DIGEST))

    assert [at_intent.position, at_observation.position, at_transition.position] == [3, 4, 5]
    history = list(ledgers().history(RUN))  # a second ledger: read back from the store, not a cache
    assert [e.position for e in history] == [1, 2, 3, 4, 5]
    assert [e.type for e in history] == [
        "RunOpened",
        "LeaseGranted",
        "IntentRecorded",
        "ObservationRecorded",
        "TransitionRecorded",
    ]
    assert all(e.prev_digest == before.digest for before, e in itertools.pairwise(history))
    observed = history[3].body
    assert isinstance(observed, ObservationRecorded)
    assert observed.result == {"bytes_written": 42}
    report = ledger.verify(RUN)
    assert (report.events, report.head_digest) == (5, history[-1].digest)
    state = ledgers().state(RUN)
    assert (state.version, state.epoch, state.holder, state.stage) == (5, 1, "A", Stage.CANDIDATE_READY)
    assert (state.operations, intended_ops(state)) == ({}, {"op-1"})
    [row] = ledger.runs()
    assert (row.run_id, row.head, row.epoch, row.holder, row.stage) == (RUN, 5, 1, "A", "CANDIDATE_READY")
    assert store.event_count(RUN) == 5


def test_duplicate_submission_returns_original_position(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given an accepted submission, when retried anywhere, even after a takeover, then: duplicate at its position."""
    clock = ManualClock(T0)
    ledger = ledgers(clock)
    worker = leased_run(ledger, ttl_ms=1_000)
    original = worker.submission(intent("op-1"))
    renewal = worker.submission(RenewLease(ttl_ms=1_000))  # deciding it again would succeed: only the id stops it
    assert ledger.submit(original).position == 3
    assert ledger.submit(renewal).position == 4

    retried = [ledger.submit(original), ledgers().submit(original)]
    renewed_again = [ledger.submit(renewal), ledgers().submit(renewal)]
    clock.advance(seconds=2)
    assert Submitter(ledger, RUN, "B").acquire().verdict == "accepted"
    retried.append(ledger.submit(original))  # its epoch is stale now: still the original answer
    renewed_again.append(ledger.submit(renewal))

    assert {(v.verdict, v.position, v.reason) for v in retried} == {("duplicate", 3, None)}
    assert {(v.verdict, v.position, v.reason) for v in renewed_again} == {("duplicate", 4, None)}
    assert positions(ledger, RUN) == [1, 2, 3, 4, 5, 6]  # open, lease, op-1, renewal, expired, granted
    submission_ids = [e.submission_id for e in ledger.history(RUN)]
    assert submission_ids.count(original.submission_id) == submission_ids.count(renewal.submission_id) == 1
    assert store.query("SELECT COUNT(*) FROM baton_submissions") == [(5,)]  # incl. B's takeover


def test_same_id_different_content_is_a_conflict(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given an accepted submission, when its id carries other content or run, then conflict, nothing stored."""
    ledger = ledgers()
    worker = leased_run(ledger)
    assert worker.submit(intent("op-1"), sid="reused").position == 3
    row_before = store.query("SELECT * FROM baton_submissions WHERE submission_id = ?", ("reused",))
    open_run(ledger, "run-2")

    other_content = worker.submit(intent("op-2"), sid="reused")
    other_run = ledger.submit(Submission("reused", "run-2", "A", intent("op-1"), 1))

    for verdict in (other_content, other_run):
        assert (verdict.verdict, verdict.reason, verdict.position) == ("rejected", "submission_conflict", None)
    assert positions(ledger, RUN) == [1, 2, 3]
    assert positions(ledger, "run-2") == [1]
    assert "op-2" not in ledger.state(RUN).operations
    assert store.query("SELECT * FROM baton_submissions WHERE submission_id = ?", ("reused",)) == row_before


def test_stale_epoch_after_takeover_stores_nothing(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given B took epoch 2 from an expired A, when A appends at epoch 1 or claims 2, then stale_epoch, no rows."""
    clock = ManualClock(T0)
    ledger = ledgers(clock)
    a = leased_run(ledger, ttl_ms=1_000)
    assert a.submit(intent("op-1")).position == 3
    clock.advance(seconds=2)
    b = Submitter(ledger, RUN, "B")
    assert b.acquire().position == 5  # LeaseExpired(A, 1) at 4, LeaseGranted(B, 2) at 5
    assert b.epoch == 2
    count_before = store.event_count(RUN)

    at_old_epoch = a.submit(intent("op-2"))
    claiming_new_epoch = a.submit(RenewLease(), epoch=2)

    for verdict in (at_old_epoch, claiming_new_epoch):
        assert (verdict.verdict, verdict.reason, verdict.current_epoch) == ("rejected", "stale_epoch", 2)
    assert store.event_count(RUN) == count_before == 5
    assert not {at_old_epoch.submission_id, claiming_new_epoch.submission_id} & store.submission_ids()
    assert b.submit(RenewLease()).position == 6  # the new owner is unaffected


def test_stale_writer_with_cached_state_is_rejected(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given ledger A cached epoch 1 and ledger B took over, when A appends, then stale_epoch and nothing is stored."""
    ledger_a, ledger_b = ledgers(ManualClock(T0)), ledgers(ManualClock(AN_HOUR_LATER))
    a = leased_run(ledger_a, ttl_ms=60_000)
    assert a.submit(intent("op-1")).position == 3
    assert ledger_a.state(RUN).epoch == 1  # ledger A's cache is warm at epoch 1
    b = Submitter(ledger_b, RUN, "B")
    assert b.acquire().verdict == "accepted"

    verdict = a.submit(intent("op-2"))

    assert (verdict.verdict, verdict.reason, verdict.current_epoch) == ("rejected", "stale_epoch", 2)
    assert store.event_count(RUN) == 5
    assert verdict.submission_id not in store.submission_ids()


def test_fence_in_the_append_transaction_stops_a_writer_that_decided_before_the_takeover(
    ledgers: LedgerFactory, store: RawStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given A decided at epoch 1, when B takes over before A's transaction, then the in-transaction fence rejects A."""
    ledger_a, ledger_b = ledgers(ManualClock(T0)), ledgers(ManualClock(AN_HOUR_LATER))
    a = leased_run(ledger_a, ttl_ms=60_000)
    b = Submitter(ledger_b, RUN, "B")
    seen: list[Any] = []
    real_insert = ledger_a.recorder.insert_events

    def insert_after_takeover(*args: Any, **kwargs: Any) -> Any:
        if not seen:  # A's decision is made and sealed; B strikes in the gap before A's transaction
            seen.append(b.acquire())
        try:
            return real_insert(*args, **kwargs)
        except FenceViolation as violation:
            seen.append(violation)
            raise

    monkeypatch.setattr(ledger_a.recorder, "insert_events", insert_after_takeover)
    verdict = a.submit(intent("op-1"))

    takeover, violation = seen
    assert takeover.verdict == "accepted"
    assert isinstance(violation, FenceViolation)
    assert (violation.epoch, violation.holder) == (2, "B")
    assert (verdict.verdict, verdict.reason, verdict.current_epoch) == ("rejected", "stale_epoch", 2)
    assert [e.type for e in ledger_a.history(RUN)] == ["RunOpened", "LeaseGranted", "LeaseExpired", "LeaseGranted"]
    assert verdict.submission_id not in store.submission_ids()
    assert ledger_a.state(RUN).epoch == 2  # the failed append dropped A's stale cache
    ledger_a.verify(RUN)


def test_budget_exceeded_stores_nothing(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given a run allowed one call, when a second intent passes the ceiling, then budget_exceeded, nothing stored."""
    ledger = ledgers()
    worker = leased_run(ledger, ceilings=Ceilings(calls=1))
    assert worker.submit(intent("op-1")).verdict == "accepted"
    assert worker.submit(observation("op-1")).verdict == "accepted"

    verdict = worker.submit(intent("op-2"))

    assert (verdict.verdict, verdict.reason) == ("rejected", "budget_exceeded")
    assert store.event_count(RUN) == 4
    assert verdict.submission_id not in store.submission_ids()
    state = ledgers().state(RUN)
    assert (state.usage.calls, state.version) == (1, 4)
    assert "op-2" not in state.operations


def test_submit_many_appends_ten_in_one_transaction(
    ledgers: LedgerFactory, store: RawStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a leased run, when ten commands are submitted as a batch, then one transaction stores them at 3..12,
    handed to the recorder as events and submission rows the cycle collector does not track, and so
    are the verdicts."""
    ledger = ledgers()
    worker = leased_run(ledger)
    batch = [worker.submission(command) for i in range(4) for command in (intent(f"op-{i}"), observation(f"op-{i}"))]
    batch.append(worker.submission(ReserveStage("review", 5)))
    batch.append(worker.submission(RecordTransition(Stage.CANDIDATE_READY, STATE_DIGEST)))
    appends: list[int] = []
    tracked: list[int] = []
    real_insert = ledger.recorder.insert_events

    def counting_insert(stored_events: Any, **kwargs: Any) -> Any:
        appends.append(len(stored_events))
        tracked.append(sum(map(gc.is_tracked, [*stored_events, *kwargs["submissions"]])))
        return real_insert(stored_events, **kwargs)

    monkeypatch.setattr(ledger.recorder, "insert_events", counting_insert)
    verdicts = ledger.submit_many(batch)

    assert [v.verdict for v in verdicts] == ["accepted"] * 10
    assert accepted_positions(verdicts) == list(range(3, 13))
    assert appends == [10]  # one insert_events call is one database transaction
    # a draft lives through its batch: tracked, its events would be promoted and bring full collections
    assert tracked == [0]
    assert not any(map(gc.is_tracked, verdicts))
    if store.backend == "postgres":  # a row's xmin is the transaction that inserted it
        rows = store.query("SELECT originator_version, xmin::text FROM batonledger_events")
        transactions = {position: xid for position, xid in rows}
        assert len({transactions[p] for p in range(3, 13)}) == 1
        assert transactions[3] not in {transactions[1], transactions[2]}
    assert positions(ledger, RUN) == list(range(1, 13))
    assert ledger.verify(RUN).events == 12


def test_submit_many_with_a_rejected_member_gives_each_its_own_verdict(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given a batch with an illegal fifth command, when submitted, then the rest are contiguous, it stores nothing."""
    ledger = ledgers()
    worker = leased_run(ledger)
    batch = [worker.submission(ReserveStage(f"stage-{i}", 1)) for i in range(10)]
    batch[4] = worker.submission(RecordTransition(Stage.VERIFIED, STATE_DIGEST))  # GENERATING -> VERIFIED

    verdicts = ledger.submit_many(batch)

    assert [(v.verdict, v.reason) for v in verdicts][4] == ("rejected", "illegal_transition")
    assert accepted_positions(verdicts) == list(range(3, 12))
    assert positions(ledger, RUN) == list(range(1, 12))
    assert batch[4].submission_id not in store.submission_ids()


def test_racing_ledgers_never_leave_a_gap_or_duplicate_a_position(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given two ledgers on one store, when both append to one run at once, then positions are unique and contiguous."""
    per_ledger = 25
    contenders = [ledgers(), ledgers()]
    worker = leased_run(contenders[0], ttl_ms=600_000)
    start = threading.Barrier(len(contenders))
    verdicts: dict[int, list[Verdict]] = {}
    failures: list[BaseException] = []

    def append(index: int) -> None:
        submitter = Submitter(contenders[index], RUN, "A", epoch=worker.epoch, prefix=f"L{index}")
        try:
            start.wait(timeout=10)
            verdicts[index] = [submitter.submit(ReserveStage(f"L{index}-{i}", 1)) for i in range(per_ledger)]
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=append, args=(i,)) for i in range(len(contenders))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert not failures
    all_verdicts = verdicts[0] + verdicts[1]
    accepted = [v for v in all_verdicts if v.verdict == "accepted"]
    gave_up = [v for v in all_verdicts if v.verdict != "accepted"]
    # A submission that keeps losing the race gives up with a retryable rejection; it stored nothing.
    assert {(v.verdict, v.reason) for v in gave_up} <= {("rejected", "concurrency_conflict")}
    assert len(accepted) >= per_ledger  # liveness, loosely: most of them made it
    assert sorted(accepted_positions(accepted)) == list(range(3, 3 + len(accepted)))
    history = list(contenders[1].history(RUN))
    assert [e.position for e in history] == list(range(1, 3 + len(accepted)))
    assert [e.submission_id for e in history[2:]] == [v.submission_id for v in sorted(accepted, key=by_position)]
    assert not {v.submission_id for v in gave_up} & store.submission_ids()
    assert contenders[0].verify(RUN).events == 2 + len(accepted)


def test_racing_ledgers_open_a_run_exactly_once(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given two ledgers, when both open the same run at once, then one is accepted at 1 and the other is run_exists."""
    contenders = [ledgers(), ledgers()]
    start = threading.Barrier(2)
    verdicts: list[Verdict] = []

    def race(index: int) -> None:
        start.wait(timeout=10)
        command = OpenRun("release-1", "agent-state", 1, TASK)
        verdicts.append(contenders[index].submit(Submission(f"open-{index}", RUN, "supervisor", command)))

    threads = [threading.Thread(target=race, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted((v.verdict, v.reason, v.position) for v in verdicts) == [
        ("accepted", None, 1),
        ("rejected", "run_exists", None),
    ]
    assert positions(contenders[0], RUN) == [1]


def test_init_store_twice_is_idempotent(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given a store with a run in it, when init_store runs twice more, then data, fence and triggers are intact."""
    ledger = ledgers()
    worker = leased_run(ledger)
    worker.submit(intent("op-1"))

    init_store(store.url)
    init_store(store.url)

    fresh = ledgers()
    assert positions(fresh, RUN) == [1, 2, 3]
    assert fresh.verify(RUN).events == 3
    assert Submitter(fresh, RUN, "A", epoch=1, prefix="again").submit(observation("op-1")).position == 4
    assert (fresh.runs()[0].head, fresh.runs()[0].epoch) == (4, 1)
    with pytest.raises((sqlite3.DatabaseError, psycopg.Error), match="append-only"):
        store.execute(f"DELETE FROM {store.events_table}")
    assert store.event_count(RUN) == 4


@pytest.mark.parametrize("statement", ["UPDATE {table} SET topic = 'forged'", "DELETE FROM {table}"])
@pytest.mark.parametrize("table", ["events", "baton_submissions"])
def test_update_and_delete_are_refused_by_trigger(
    ledgers: LedgerFactory, store: RawStore, statement: str, table: str
) -> None:
    """Given a stored run, when raw SQL updates or deletes its events or submission rows, then the trigger refuses."""
    ledger = ledgers()
    leased_run(ledger).submit(intent("op-1"))
    name = store.events_table if table == "events" else table
    if table == "baton_submissions":
        statement = statement.replace("topic", "run_id")
    before = store.query(f"SELECT * FROM {name} ORDER BY 1, 2")

    with pytest.raises((sqlite3.DatabaseError, psycopg.Error), match="append-only"):
        store.execute(statement.format(table=name))

    assert store.query(f"SELECT * FROM {name} ORDER BY 1, 2") == before
    assert ledger.verify(RUN).events == 3


def test_rejected_submissions_leave_no_submission_rows(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given rejections of every kind, when the submissions table is read, then it holds exactly the accepted ids."""
    clock = ManualClock(T0)
    ledger = ledgers(clock)
    a = leased_run(ledger, ttl_ms=1_000, ceilings=Ceilings(calls=2))
    op_1 = a.submit(intent("op-1"))
    a.submit(observation("op-1"))
    rejected = [
        a.submit(RecordTransition(Stage.COMMITTED, STATE_DIGEST)),
        a.submit(RenewLease(ttl_ms=0)),
        a.submit(intent("op-1")),
        a.submit(intent("op-2"), sid=op_1.submission_id),
    ]
    op_3 = a.submit(intent("op-3"))  # the second and last call the budget allows
    a.submit(observation("op-3"))
    rejected.append(a.submit(intent("op-4")))
    clock.advance(seconds=2)
    takeover = Submitter(ledger, RUN, "B").acquire()
    rejected.append(a.submit(intent("op-5")))

    assert [v.reason for v in rejected] == [
        "illegal_transition",
        "malformed",
        "duplicate_operation",
        "submission_conflict",
        "budget_exceeded",
        "stale_epoch",
    ]
    accepted = [("open-run-1", 1), ("A-0", 2), (op_1.submission_id, 3), ("A-2", 4), (op_3.submission_id, 5)]
    accepted += [("A-7", 6), (takeover.submission_id, 8)]  # LeaseExpired at 7 and LeaseGranted at 8: one submission
    rows = store.query("SELECT submission_id, position FROM baton_submissions ORDER BY position")
    assert rows == accepted
    assert {e.submission_id for e in ledger.history(RUN)} == {sid for sid, _ in accepted}
    assert not {v.submission_id for v in rejected} - {op_1.submission_id} & store.submission_ids()


def test_same_id_with_an_integer_turned_string_is_a_conflict(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given an accepted intent with argument n=1, when its id is reused with n='1', then submission_conflict."""
    ledger = ledgers()
    worker = leased_run(ledger)
    assert worker.submit(intent("op-1", n=1), sid="typed").position == 3

    verdict = worker.submit(intent("op-1", n="1"), sid="typed")

    assert (verdict.verdict, verdict.reason) == ("rejected", "submission_conflict")


def test_same_id_with_its_dicts_built_in_another_order_is_a_duplicate(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given an accepted intent with arguments a=1, b=2, when retried with them built as b=2, a=1, then
    duplicate at its position: the content is the same."""
    ledger = ledgers()
    worker = leased_run(ledger)
    assert worker.submit(intent("op-1", a=1, b=2), sid="ordered").position == 3

    verdict = worker.submit(intent("op-1", b=2, a=1), sid="ordered")

    assert (verdict.verdict, verdict.position) == ("duplicate", 3)


def test_a_row_written_in_the_positional_digest_form_still_tells_a_retry_from_a_conflict(
    ledgers: LedgerFactory, store: RawStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a submission recorded by an earlier build (its row holds the positional form of the content
    digest), when it is retried, then duplicate; when its id is reused for other content, then conflict."""
    ledger = ledgers()
    worker = leased_run(ledger)
    original = worker.submission(intent("op-1", n=1))
    with monkeypatch.context() as earlier_build:
        earlier_build.setattr(ledger_module, "submission_digest", content_digest.positional_digest)
        assert ledger.submit(original).position == 3
    [(stored_digest,)] = store.query(
        "SELECT content_digest FROM baton_submissions WHERE submission_id = ?", (original.submission_id,)
    )
    assert stored_digest == content_digest.positional_digest(original) != content_digest.submission_digest(original)

    retried = ledgers().submit(original)
    reused = ledgers().submit(msgspec.structs.replace(original, command=intent("op-1", n="1")))

    assert (retried.verdict, retried.position) == ("duplicate", 3)
    assert (reused.verdict, reused.reason) == ("rejected", "submission_conflict")
    assert positions(ledger, RUN) == [1, 2, 3]


def fail_next_append(monkeypatch: pytest.MonkeyPatch, ledger: RunLedger) -> None:
    """Make the ledger's next append fail before commit, as a lost connection or a lock timeout would."""
    real_insert = ledger.recorder.insert_events
    failed: list[bool] = []

    def insert_or_fail(stored_events: Any, **kwargs: Any) -> Any:
        if not failed:
            failed.append(True)
            raise OperationalError("connection lost before commit (simulated)")
        return real_insert(stored_events, **kwargs)

    monkeypatch.setattr(ledger.recorder, "insert_events", insert_or_fail)


def test_failed_append_leaves_no_phantom_state(
    ledgers: LedgerFactory, store: RawStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given an append that failed before commit, when the ledger's state is read, then it shows only what is stored."""
    ledger = ledgers()
    worker = leased_run(ledger)
    fail_next_append(monkeypatch, ledger)

    with pytest.raises(StoreUnavailable):
        worker.submit(intent("op-1"))

    assert store.event_count(RUN) == 2
    state = ledger.state(RUN)
    assert (state.version, sorted(state.operations)) == (2, [])
    assert worker.submit(intent("op-1")).position == 3  # the op id the failed append rolled back is free


def test_append_after_a_failed_append_keeps_the_chain_intact(
    ledgers: LedgerFactory, store: RawStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given ledger 1 failed to append and ledger 2 took that position, when ledger 1 appends, then the chain holds."""
    ledger_1, ledger_2 = ledgers(), ledgers()
    worker_1 = leased_run(ledger_1)
    worker_2 = Submitter(ledger_2, RUN, "A", epoch=1, prefix="L2")
    fail_next_append(monkeypatch, ledger_1)
    with pytest.raises(StoreUnavailable):
        worker_1.submit(intent("op-1"))
    assert worker_2.submit(intent("op-x")).position == 3

    verdict = worker_1.submit(observation("op-x"))

    assert verdict.verdict == "accepted"
    assert ledger_2.verify(RUN).events == store.event_count(RUN)


def test_a_lost_race_reads_only_the_tail_and_decides_like_a_fresh_fold(
    ledgers: LedgerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given two ledgers taking turns on one run, when each appends, then a miss reads the tail, never the whole run."""
    ledger_1, ledger_2 = ledgers(), ledgers()
    worker_1 = leased_run(ledger_1, ttl_ms=600_000)
    worker_2 = Submitter(ledger_2, RUN, "A", epoch=worker_1.epoch, prefix="L2")
    assert worker_2.submit(intent("op-warm")).verdict == "accepted"  # ledger 2 has folded the run once
    reads: list[int] = []
    for ledger in (ledger_1, ledger_2):
        select_events = ledger.store.select_events

        def spy(run_id: str, *, gt: int | None = None, _select: Any = select_events, **kwargs: Any) -> Any:
            reads.append(gt or 0)
            return _select(run_id, gt=gt, **kwargs)

        monkeypatch.setattr(ledger.store, "select_events", spy)

    assert worker_2.submit(observation("op-warm")).verdict == "accepted"
    for i in range(6):
        worker = worker_1 if i % 2 else worker_2
        assert worker.submit(intent(f"op-{i}")).verdict == "accepted"
        assert worker.submit(observation(f"op-{i}")).verdict == "accepted"
        assert worker.submit(intent(f"op-{i}")).reason == "duplicate_operation"  # op ids survive the misses

    assert reads and min(reads) > 0  # every catch-up starts at a cached head, never at the first event
    fresh = ledgers().state(RUN)
    for ledger in (ledger_1, ledger_2):
        assert ledger.state(RUN) == fresh


def test_an_interrupt_in_the_middle_of_a_batch_leaves_no_phantom_state(
    ledgers: LedgerFactory, store: RawStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a batch interrupted after its first submission was applied, then nothing of it sticks anywhere."""
    ledger = ledgers()
    worker = leased_run(ledger)
    real_seal, calls = ledger_module.seal_stored, []

    def seal_then_interrupt(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt("between decide and put")
        return real_seal(*args, **kwargs)

    monkeypatch.setattr(ledger_module, "seal_stored", seal_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        ledger.submit_many([worker.submission(intent("op-1")), worker.submission(intent("op-2"))])
    monkeypatch.setattr(ledger_module, "seal_stored", real_seal)

    assert store.event_count(RUN) == 2
    assert ledger.state(RUN).version == 2
    assert worker.submit(intent("op-1")).position == 3  # neither the position nor the op id is taken


def test_a_failed_batch_puts_back_the_operations_it_settled_and_added(
    ledgers: LedgerFactory, store: RawStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given op-1 open, when a batch observing op-1 and intending op-2 fails before commit, then the ledger
    shows op-1 still open and no op-2 (the undo point shares the open operations until the observation),
    and the same batch is accepted afterwards."""
    ledger = ledgers()
    worker = leased_run(ledger)
    assert worker.submit(intent("op-1")).position == 3
    observed = RecordObservation("op-1", context_digest(intent("op-1").context), "ok")
    batch = [worker.submission(observed), worker.submission(intent("op-2"))]
    fail_next_append(monkeypatch, ledger)

    with pytest.raises(StoreUnavailable):
        ledger.submit_many(batch)

    state = ledger.state(RUN)
    assert (state.version, sorted(state.operations)) == (3, ["op-1"])
    assert accepted_positions(ledger.submit_many(batch)) == [4, 5]
    assert sorted(ledger.state(RUN).operations) == ["op-2"]


def test_a_multi_run_batch_with_stale_runs_names_the_first_and_stores_nothing_of_the_batch(
    ledgers: LedgerFactory, store: RawStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given A leases runs r-a, r-b, r-c and B took r-c and r-b, when A batches one intent per run,
    then the batch's one transaction fails naming r-b (the first stale run in run order, at B's
    epoch), nothing of it is stored, and each retried submission gets its own verdict."""
    ledger_a, ledger_b = ledgers(ManualClock(T0)), ledgers(ManualClock(AN_HOUR_LATER))
    workers = {}
    for run_id in ("r-c", "r-a", "r-b"):
        assert open_run(ledger_a, run_id).verdict == "accepted"
        workers[run_id] = Submitter(ledger_a, run_id, "A", prefix=f"A-{run_id}")
        assert workers[run_id].acquire(ttl_ms=60_000).verdict == "accepted"
    for run_id in ("r-c", "r-b"):  # A's cache still says epoch 1
        assert Submitter(ledger_b, run_id, "B", prefix=f"B-{run_id}").acquire().verdict == "accepted"
    failures: list[BaseException] = []
    real_insert = ledger_a.recorder.insert_events

    def watching_insert(stored_events: Any, **kwargs: Any) -> Any:
        try:
            return real_insert(stored_events, **kwargs)
        except FenceViolation as violation:
            failures.append(violation)
            raise

    monkeypatch.setattr(ledger_a.recorder, "insert_events", watching_insert)
    batch = [workers[run_id].submission(intent(f"op-{run_id}")) for run_id in ("r-c", "r-b", "r-a")]
    verdicts = ledger_a.submit_many(batch)

    violation = failures[0]
    assert isinstance(violation, FenceViolation)
    assert (violation.run_id, violation.epoch, violation.holder) == ("r-b", 2, "B")
    assert [(v.run_id, v.verdict, v.reason) for v in verdicts] == [
        ("r-c", "rejected", "stale_epoch"),
        ("r-b", "rejected", "stale_epoch"),
        ("r-a", "accepted", None),
    ]
    assert store.event_count("r-a") == 3
    assert {store.event_count(run_id) for run_id in ("r-b", "r-c")} == {4}  # opened, A, expired, B: none of A's
    assert not {batch[0].submission_id, batch[1].submission_id} & store.submission_ids()
    for run_id in ("r-a", "r-b", "r-c"):
        ledger_a.verify(run_id)


def test_threads_of_one_ledger_append_to_their_own_runs(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given four runs, each leased by its own worker, when four threads of one ledger each submit 40
    intents to their run, then every intent is accepted at the next position of its run and every
    chain verifies (SQLite: the threads take turns on the append connection; PostgreSQL: one
    appends on the kept connection, the others on pooled ones)."""
    ledger = ledgers()
    workers = []
    for n in range(4):
        run_id = f"run-{n}"
        assert open_run(ledger, run_id).verdict == "accepted"
        worker = Submitter(ledger, run_id, f"W{n}")
        assert worker.acquire(ttl_ms=600_000).verdict == "accepted"
        workers.append(worker)
    positions: dict[str, list[int | None]] = {}

    def append(worker: Submitter) -> None:
        positions[worker.run_id] = [worker.submit(ReserveStage(f"stage-{i}", 1)).position for i in range(40)]

    threads = [threading.Thread(target=append, args=(worker,)) for worker in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert positions == {f"run-{n}": list(range(3, 43)) for n in range(4)}
    assert [ledger.verify(f"run-{n}").events for n in range(4)] == [42] * 4
    assert sum(store.event_count(f"run-{n}") for n in range(4)) == 4 * 42
