"""Resume snapshots: a resume folds the latest snapshot plus the events after it, never less truth.

A snapshot is a cache, never evidence: one a resume did not write for this run, at this position,
on this log is ignored (and logged), and the audit compares every stored snapshot with the fold.
"""

from __future__ import annotations

import logging
import uuid

import msgspec
import pytest
from integration_support import LedgerFactory, RawStore, Submitter, intent, open_run

from baton.adapters.audit_runner import audit_store
from baton.adapters.bootstrap import open_ledger
from baton.adapters.eventstore import snapshots as sealed
from baton.adapters.eventstore.ledger import SNAPSHOT_EVERY, RunLedger
from baton.adapters.eventstore.store_identity import StoreIdentity
from baton.domain.commands import RecordObservation
from baton.domain.decide import context_digest
from baton.projections.portable_state import PortableStateFold
from baton.projections.resumability import summary_of

RUN = "run-snap"


def busy_run(ledger: RunLedger, operations: int, run_id: str = RUN) -> Submitter:
    """A run with ``operations`` settled pure intents (two events each) after open and acquire."""
    open_run(ledger, run_id)
    worker = Submitter(ledger, run_id, "A", prefix=run_id)  # submission ids are per store
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


def table(store: RawStore) -> str:
    return "stored_snapshots" if store.backend == "sqlite" else "batonledger_snapshots"


def snapshot_rows(store: RawStore, run_id: str = RUN) -> list[tuple[int, str, bytes]]:
    statement = f"SELECT originator_version, topic, state FROM {table(store)} WHERE originator_id = ? ORDER BY 1"
    return [(int(p), str(topic), bytes(state)) for p, topic, state in store.query(statement, (run_id,))]


def put_snapshot(store: RawStore, position: int, stored: bytes, *, run_id: str = RUN, replace: bool = True) -> None:
    """Write a snapshot row behind the ledger's back, as someone with write access to the table could."""
    statements: list[str | tuple[str, tuple[object, ...]]] = []
    if replace:
        statements.append((f"DELETE FROM {table(store)} WHERE originator_id = ?", (run_id,)))
    insert = f"INSERT INTO {table(store)} (originator_id, originator_version, topic, state) VALUES (?, ?, ?, ?)"
    statements.append((insert, (run_id, position, sealed.TOPIC, stored)))
    store.execute(*statements)


def as_mallory(data: bytes) -> bytes:
    """The fold ``data`` re-encoded as the ledger would, with the lease holder "mallory" and no calls."""
    fold = PortableStateFold.from_bytes(data)
    run = fold.run
    assert run.lease is not None
    run.lease = msgspec.structs.replace(run.lease, worker="mallory")
    run.usage = msgspec.structs.replace(run.usage, calls=0)
    return fold.to_bytes()


def snapshot_problems(ledger: RunLedger, run_id: str = RUN) -> list[tuple[int, str]]:
    return [(p.position, p.code) for p in audit_store(ledger, run_id).problems]


def test_a_long_resume_writes_a_snapshot_and_the_next_resume_starts_from_it(
    ledgers: LedgerFactory, store: RawStore
) -> None:
    """Given a run longer than the snapshot interval, when it is resumed twice with events in between, then the
    first resume leaves a snapshot at its head, the second equals a full fold from scratch and leaves another,
    and the audit finds both equal to the fold at their positions."""
    ledger = ledgers()
    worker = busy_run(ledger, SNAPSHOT_EVERY)
    first = ledger.resume_fold(RUN)
    assert [row[0] for row in snapshot_rows(store)] == [first.run.version]

    add_operations(worker, SNAPSHOT_EVERY, SNAPSHOT_EVERY)
    continued = ledgers().resume_fold(RUN)  # a fresh process: nothing cached
    full = ledger.resume_fold(RUN, snapshots=False)
    assert continued.snapshot() == full.snapshot()
    assert summary_of(continued).prefix == summary_of(full).prefix
    assert continued.run.version == first.run.version + 2 * SNAPSHOT_EVERY
    assert [row[0] for row in snapshot_rows(store)] == [first.run.version, continued.run.version]
    assert audit_store(ledger, RUN).ok


def test_a_tampered_snapshot_is_ignored_logged_and_named_by_the_audit(
    ledgers: LedgerFactory, store: RawStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Given the stored snapshot re-encoded with holder "mallory" and no calls behind its old tag, when the run
    resumes, then the snapshot is ignored with a warning naming run and position, the result equals a fold from
    scratch, and the audit reports snapshot_mismatch at that position."""
    ledger = ledgers()
    worker = busy_run(ledger, SNAPSHOT_EVERY)
    ledger.resume_fold(RUN)
    add_operations(worker, SNAPSHOT_EVERY, 3)
    ((position, _, stored),) = snapshot_rows(store)
    tag, data = stored[: sealed.TAG_BYTES], stored[sealed.TAG_BYTES :]
    put_snapshot(store, position, tag + as_mallory(data))

    with caplog.at_level(logging.WARNING, logger="baton.snapshots"):
        resumed = ledgers().resume_fold(RUN)

    assert resumed.snapshot() == ledger.resume_fold(RUN, snapshots=False).snapshot()
    assert (resumed.run.holder, resumed.run.usage.calls) == ("A", SNAPSHOT_EVERY + 3)
    assert [(r.args[0], r.args[1]) for r in caplog.records if "ignored" in r.getMessage()] == [(RUN, position)]
    problems = audit_store(ledger, RUN).problems
    assert [(p.position, p.code) for p in problems] == [(position, "snapshot_mismatch")]
    assert "run.usage" in problems[0].detail and "run.lease" in problems[0].detail


@pytest.mark.parametrize("source", ["another position", "another run"])
def test_a_snapshot_copied_from_elsewhere_is_ignored(ledgers: LedgerFactory, store: RawStore, source: str) -> None:
    """Given a genuine snapshot row copied to a later position of its run, or from another run, when the run
    resumes, then the copy is ignored (its tag binds run, position and digest) and the audit names it."""
    ledger = ledgers()
    worker = busy_run(ledger, SNAPSHOT_EVERY)
    ledger.resume_fold(RUN)
    add_operations(worker, SNAPSHOT_EVERY, 3)
    if source == "another position":
        ((_, _, stored),) = snapshot_rows(store)
        position = ledger.state(RUN).version
        put_snapshot(store, position, stored, replace=False)  # the latest row now: the resume reads it
    else:
        busy_run(ledger, SNAPSHOT_EVERY, run_id="run-twin")
        ledger.resume_fold("run-twin")
        ((position, _, stored),) = snapshot_rows(store, "run-twin")
        put_snapshot(store, position, stored)

    resumed = ledgers().resume_fold(RUN)

    assert resumed.snapshot() == ledger.resume_fold(RUN, snapshots=False).snapshot()
    assert snapshot_problems(ledger) == [(position, "snapshot_mismatch")]


def test_a_snapshot_of_a_run_without_events_is_named_by_the_audit(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given a genuine snapshot row copied under a run id that has no events and no run row, when every run is
    audited (or that one), then snapshot_mismatch at its position for that run, and nothing else."""
    ledger = ledgers()
    busy_run(ledger, SNAPSHOT_EVERY)
    ledger.resume_fold(RUN)
    ((position, _, stored),) = snapshot_rows(store)
    put_snapshot(store, position, stored, run_id="ghost")

    everything = audit_store(ledger)

    assert [(p.run_id, p.position, p.code) for p in everything.problems] == [("ghost", position, "snapshot_mismatch")]
    assert snapshot_problems(ledger, "ghost") == [(position, "snapshot_mismatch")]


def test_a_snapshot_forged_with_the_stores_key_is_used_and_only_the_audit_catches_it(
    ledgers: LedgerFactory, store: RawStore
) -> None:
    """Given someone who can read baton_store forging a snapshot with a valid tag, when the run resumes, then the
    resume starts from it (a tag proves who wrote a row, not that it is true) and the audit names it."""
    ledger = ledgers()
    busy_run(ledger, SNAPSHOT_EVERY)
    ledger.resume_fold(RUN)
    ((position, _, stored),) = snapshot_rows(store)
    ((store_id, public_key, private_key),) = store.query("SELECT store_id, public_key, private_key FROM baton_store")
    key = StoreIdentity(store_id, public_key, bytes(private_key)).snapshot_key()
    digest = ledger.state(RUN).head_digest
    put_snapshot(store, position, sealed.seal(key, RUN, position, digest, as_mallory(stored[sealed.TAG_BYTES :])))

    resumed = ledgers().resume_fold(RUN)

    assert (resumed.run.holder, resumed.run.usage.calls) == ("mallory", 0)  # the fold started from the snapshot
    assert snapshot_problems(ledger) == [(position, "snapshot_mismatch")]


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_a_role_that_may_not_read_the_key_resumes_from_the_log_and_audits(
    ledgers: LedgerFactory, store: RawStore
) -> None:
    """Given a PostgreSQL role that may read the log and the snapshots but not baton_store, when it resumes a run
    with a snapshot, then it folds from the log and writes no snapshot; its audit compares the snapshot: ok."""
    ledger = ledgers()
    worker = busy_run(ledger, SNAPSHOT_EVERY)
    ledger.resume_fold(RUN)
    add_operations(worker, SNAPSHOT_EVERY, SNAPSHOT_EVERY)
    role = f"reader_{uuid.uuid4().hex[:8]}"
    readable = "batonledger_events, baton_runs, baton_submissions, baton_migrations, batonledger_snapshots"
    store.execute(f"CREATE ROLE {role} LOGIN", f"GRANT SELECT ON {readable} TO {role}")
    try:
        reader = open_ledger(store.url.replace("postgresql://postgres@", f"postgresql://{role}@"))
        try:
            resumed, report = reader.resume_fold(RUN), audit_store(reader, RUN)
        finally:
            reader.close()
    finally:
        store.execute(f"DROP OWNED BY {role}", f"DROP ROLE {role}")

    assert resumed.snapshot() == ledger.resume_fold(RUN, snapshots=False).snapshot()
    assert len(snapshot_rows(store)) == 1
    assert report.ok


@pytest.mark.parametrize("snapshots", [True, False])
def test_resume_of_a_short_run_writes_no_snapshot(ledgers: LedgerFactory, store: RawStore, snapshots: bool) -> None:
    """Given a run shorter than the interval, when it is resumed, then no snapshot is written."""
    ledger = ledgers()
    busy_run(ledger, 5)
    assert ledger.resume_fold(RUN, snapshots=snapshots).run.version == 12
    assert snapshot_rows(store) == []
