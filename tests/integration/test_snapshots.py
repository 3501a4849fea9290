"""Resume snapshots: a resume folds the latest snapshot plus the events after it, never less truth."""

from __future__ import annotations

import msgspec
import pytest
from integration_support import LedgerFactory, RawStore, Submitter, intent, open_run

from baton.adapters.eventstore.ledger import SNAPSHOT_EVERY, RunLedger
from baton.domain.commands import RecordObservation
from baton.domain.decide import context_digest
from baton.projections.resumability import summary_of

RUN = "run-snap"


def busy_run(ledger: RunLedger, operations: int) -> Submitter:
    """A run with ``operations`` settled pure intents (two events each) after open and acquire."""
    open_run(ledger, RUN)
    worker = Submitter(ledger, RUN, "A")
    worker.acquire(ttl_ms=3_600_000)
    add_operations(worker, 0, operations)
    return worker


def add_operations(worker: Submitter, start: int, count: int) -> None:
    batch = []
    for n in range(start, start + count):
        command = intent(f"op-{n}", n=n)
        batch.append(worker.submission(command))
        observed = RecordObservation(f"op-{n}", context_digest(command.context), "ok", result={"n": n})
        batch.append(worker.submission(observed))
    assert all(v.verdict == "accepted" for v in worker.ledger.submit_many(batch))


def snapshot_positions(store: RawStore) -> list[int]:
    table = "stored_snapshots" if store.backend == "sqlite" else "batonledger_snapshots"
    return [row[0] for row in store.query(f"SELECT originator_version FROM {table} WHERE originator_id = ?", (RUN,))]


def test_a_long_resume_writes_a_snapshot_and_the_next_resume_starts_from_it(
    ledgers: LedgerFactory, store: RawStore
) -> None:
    """Given a run longer than the snapshot interval, when it is resumed twice with events in between, then the
    first resume leaves a snapshot at its head and the second equals a full fold from scratch."""
    ledger = ledgers()
    worker = busy_run(ledger, SNAPSHOT_EVERY)
    first = ledger.resume_fold(RUN)
    assert snapshot_positions(store) == [first.run.version]

    add_operations(worker, SNAPSHOT_EVERY, 10)
    continued = ledgers().resume_fold(RUN)  # a fresh process: nothing cached
    full = ledger.resume_fold(RUN, snapshots=False)
    assert continued.snapshot() == full.snapshot()
    assert summary_of(continued).prefix == summary_of(full).prefix
    assert continued.run.version == first.run.version + 20


def test_a_snapshot_that_does_not_chain_onto_the_log_is_ignored(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given a snapshot whose head digest disagrees with the stored log, when a run resumes, then the snapshot is
    ignored and the result equals a fold from scratch."""
    ledger = ledgers()
    worker = busy_run(ledger, SNAPSHOT_EVERY)
    ledger.resume_fold(RUN)
    add_operations(worker, SNAPSHOT_EVERY, 3)
    table = "stored_snapshots" if store.backend == "sqlite" else "batonledger_snapshots"
    (position, data), *_ = store.query(f"SELECT originator_version, state FROM {table} WHERE originator_id = ?", (RUN,))
    forged = msgspec.msgpack.decode(bytes(data))
    forged["run"]["head_digest"] = "sha256:" + "e" * 64
    forged["run"]["usage"]["calls"] = 1
    store.execute((f"DELETE FROM {table} WHERE originator_id = ?", (RUN,)))
    store.execute(
        (
            f"INSERT INTO {table} (originator_id, originator_version, topic, state) VALUES (?, ?, ?, ?)",
            (RUN, position, "forged", msgspec.msgpack.encode(forged)),
        )
    )

    resumed = ledgers().resume_fold(RUN)
    assert resumed.snapshot() == ledger.resume_fold(RUN, snapshots=False).snapshot()
    assert resumed.run.usage.calls == SNAPSHOT_EVERY + 3


@pytest.mark.parametrize("snapshots", [True, False])
def test_resume_of_a_short_run_writes_no_snapshot(ledgers: LedgerFactory, store: RawStore, snapshots: bool) -> None:
    """Given a run shorter than the interval, when it is resumed, then no snapshot is written."""
    ledger = ledgers()
    busy_run(ledger, 5)
    assert ledger.resume_fold(RUN, snapshots=snapshots).run.version == 12
    assert snapshot_positions(store) == []
