"""SQLite appends through the library's transaction: a large batch stored whole, a refused row named
exactly with nothing stored, and a locked file reported as unavailable."""

from __future__ import annotations

import sqlite3
from urllib.parse import unquote, urlsplit

import pytest
from eventsourcing.persistence import StoredEvent
from integration_support import LedgerFactory, RawStore, Submitter, intent, open_run

from baton.adapters.eventstore import RunLedger
from baton.adapters.eventstore.fenced import AppendConflict, DuplicateSubmission, RunRow, SubmissionRow
from baton.adapters.eventstore.sqlite_recorder import FencedSQLiteRecorder
from baton.domain.commands import ReserveStage
from baton.domain.errors import StoreUnavailable
from baton.domain.fencing import Fence

pytestmark = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)

BATCH = 450
RUN = "run-1"


def recorder(ledger: RunLedger) -> FencedSQLiteRecorder:
    assert isinstance(ledger.recorder, FencedSQLiteRecorder)
    return ledger.recorder


def leased(ledger: RunLedger) -> Submitter:
    """Given run ``RUN``, open and leased by worker A at epoch 1 (events 1 and 2)."""
    assert open_run(ledger, RUN).verdict == "accepted"
    worker = Submitter(ledger, RUN, "A")
    assert worker.acquire(ttl_ms=600_000).verdict == "accepted"
    return worker


def test_a_batch_larger_than_one_statement_is_stored_whole_and_in_order(
    ledgers: LedgerFactory, store: RawStore
) -> None:
    """Given a leased run, when 450 stage reservations are submitted as one batch, then each is accepted at its
    own position, stored there under its own submission id, the chain verifies, and a retry of one
    of them is a duplicate at its position."""
    ledger = ledgers()
    worker = leased(ledger)
    batch = [worker.submission(ReserveStage(f"stage-{i}", 1)) for i in range(BATCH)]

    verdicts = ledger.submit_many(batch)

    assert [(v.verdict, v.position) for v in verdicts] == [("accepted", 3 + i) for i in range(BATCH)]
    assert store.event_count(RUN) == 2 + BATCH
    stored = store.query("SELECT submission_id, position FROM baton_submissions WHERE run_id = ?", (RUN,))
    assert {sid: position for sid, position in stored if sid in {s.submission_id for s in batch}} == {
        s.submission_id: 3 + i for i, s in enumerate(batch)
    }
    assert [event.body.stage_id for event in ledger.history(RUN, after=2)] == [f"stage-{i}" for i in range(BATCH)]  # type: ignore[attr-defined]
    assert ledger.verify(RUN).events == 2 + BATCH
    assert ledger.submit(batch[250]).verdict == "duplicate"
    assert ledger.submit(batch[250]).position == 253


def raw_batch(
    row: RunRow, submission_ids: list[str], *, first_position: int | None = None
) -> tuple[Fence, list[SubmissionRow], list[StoredEvent]]:
    """A batch for the recorder itself: the fence that moves ``row`` on by one event per submission id."""
    start = row.head + 1 if first_position is None else first_position
    fence = Fence(
        row.run_id,
        row.head,
        row.head_digest,
        row.epoch,
        row.holder,
        row.head + len(submission_ids),
        "sha256:" + "f" * 64,
        row.epoch,
        row.holder,
        row.expires_at,
        row.stage,
        row.status,
    )
    rows = [SubmissionRow(sid, row.run_id, "sha256:c", start + i) for i, sid in enumerate(submission_ids)]
    events = [StoredEvent(row.run_id, start + i, "domain.events:X", b"{}") for i in range(len(submission_ids))]
    return fence, rows, events


@pytest.mark.parametrize("refused", [0, 250, BATCH - 1], ids=["first", "middle", "last"])
def test_a_reused_submission_id_is_named_and_nothing_is_stored(
    ledgers: LedgerFactory, store: RawStore, refused: int
) -> None:
    """Given a run with stored submissions, when the recorder appends a 450-event batch whose
    submission at ``refused`` reuses a stored id, then it names that id and stores nothing."""
    ledger = ledgers()
    leased(ledger)
    row = recorder(ledger).select_run(RUN)
    ids = [f"new-{i}" for i in range(BATCH)]
    ids[refused] = "A-0"  # the lease's submission, stored at position 2
    fence, rows, events = raw_batch(row, ids)
    before = store.submission_ids()

    with pytest.raises(DuplicateSubmission) as refusal:
        recorder(ledger).insert_events(events, fences=[fence], submissions=rows)

    assert refusal.value.submission_id == "A-0"
    assert store.submission_ids() == before
    assert store.event_count(RUN) == 2
    assert recorder(ledger).select_run(RUN) == row


def test_a_submission_id_twice_in_one_batch_is_named_at_its_second_use(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given a batch whose submission 310 repeats the id of submission 7, when the recorder appends
    it, then it names that id and stores nothing."""
    ledger = ledgers()
    leased(ledger)
    row = recorder(ledger).select_run(RUN)
    ids = [f"new-{i}" for i in range(BATCH)]
    ids[310] = ids[7]
    fence, rows, events = raw_batch(row, ids)

    with pytest.raises(DuplicateSubmission) as refusal:
        recorder(ledger).insert_events(events, fences=[fence], submissions=rows)

    assert refusal.value.submission_id == "new-7"
    assert not {sid for sid in ids} & store.submission_ids()
    assert store.event_count(RUN) == 2


def test_an_event_at_a_taken_position_is_a_conflict_and_nothing_is_stored(
    ledgers: LedgerFactory, store: RawStore
) -> None:
    """Given a run with two events, when the recorder appends a 450-event batch starting at position 2
    (taken) behind a fence that matches, then it is an append conflict and nothing is stored."""
    ledger = ledgers()
    leased(ledger)
    row = recorder(ledger).select_run(RUN)
    fence, rows, events = raw_batch(row, [f"new-{i}" for i in range(BATCH)], first_position=2)

    with pytest.raises(AppendConflict):
        recorder(ledger).insert_events(events, fences=[fence], submissions=rows)

    assert not {r.submission_id for r in rows} & store.submission_ids()
    assert store.event_count(RUN) == 2
    assert recorder(ledger).select_run(RUN) == row


def test_a_store_locked_past_the_busy_timeout_is_unavailable_and_the_next_append_goes_through(
    ledgers: LedgerFactory, store: RawStore
) -> None:
    """Given a leased run and another connection holding the file's write lock past the ledger's busy
    timeout, when an intent is submitted, then the store is unavailable and nothing is stored; once the
    lock is gone, the same intent is accepted at the next position, and the chain verifies."""
    ledger = ledgers()
    recorder(ledger).datastore.pool.lock_timeout = 1  # seconds, for the connections the pool makes from here on
    worker = leased(ledger)
    blocker = sqlite3.connect(unquote(urlsplit(store.url).path)[1:], isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreUnavailable, match="locked"):
            worker.submit(intent("op-1"), sid="s-1")
        assert store.event_count(RUN) == 2
    finally:
        blocker.close()

    verdict = worker.submit(intent("op-1"), sid="s-1")

    assert (verdict.verdict, verdict.position) == ("accepted", 3)
    assert ledger.verify(RUN).events == store.event_count(RUN) == 3
