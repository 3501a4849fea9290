"""Tampering behind the ledger's back, found by the audit with the right code at the right position.

The attacker has database access: it disables the append-only trigger (PostgreSQL) or drops it
(SQLite) and edits the events table directly, as in test_tampering.py. Each test runs on both.
"""

from __future__ import annotations

import contextlib

import msgspec
import pytest
from integration_support import T0, LedgerFactory, RawStore, Submitter, intent, open_run

from baton.adapters import audit_runner
from baton.adapters.audit_runner import audit_store
from baton.adapters.clock import ManualClock
from baton.adapters.eventstore import RunLedger
from baton.adapters.eventstore.audit_reader import stored_rows
from baton.adapters.eventstore.mapper import TOPIC_PREFIX
from baton.domain.budgets import Usage
from baton.domain.canonical import canonical_bytes
from baton.domain.chain import seal
from baton.domain.commands import RecordIntent, RecordObservation, RecordTransition, ReleaseLease, Submission
from baton.domain.decide import context_digest, decide
from baton.domain.events import IntentRecorded, RecordedEvent
from baton.domain.stages import Stage
from baton.projections.audit import Problem

RUN = "audited"
OTHER = "bystander"


def short_run(ledger: RunLedger, run_id: str = RUN) -> None:
    """Five valid events: opened, leased, intent, observation, transition."""
    assert open_run(ledger, run_id).position == 1
    worker = Submitter(ledger, run_id, "A", prefix=f"{run_id}-A")
    worker.acquire()
    command = intent("op-1", kind="effect", n=7)
    worker.submit(command)
    worker.submit(RecordObservation("op-1", context_digest(command.context), "ok", result={"x": 1}))
    assert worker.submit(RecordTransition(Stage.CANDIDATE_READY, "sha256:" + "cd" * 32)).position == 5


def tampered(store: RawStore, *statements: str | tuple[str, tuple[object, ...]]) -> None:
    """Run statements with the append-only triggers out of the way."""
    if store.backend == "sqlite":
        drops = [f"DROP TRIGGER IF EXISTS stored_events_no_{verb}" for verb in ("update", "delete")]
        store.execute(*drops, *statements)
    else:
        toggle = "ALTER TABLE batonledger_events {} TRIGGER baton_append_only"
        store.execute(toggle.format("DISABLE"), *statements, toggle.format("ENABLE"))


def set_state(store: RawStore, position: int, state: bytes) -> tuple[str, tuple[object, ...]]:
    return (
        f"UPDATE {store.events_table} SET state = ? WHERE originator_id = ? AND originator_version = ?",
        (state, RUN, position),
    )


def insert(store: RawStore, event: RecordedEvent) -> None:
    """Insert a row as the recorder would, but without the fence or the run row."""
    topic = TOPIC_PREFIX + event.type
    state = msgspec.json.encode(event)
    if store.backend == "sqlite":
        statement = "INSERT INTO stored_events (originator_id, originator_version, topic, state) VALUES (?, ?, ?, ?)"
        store.execute((statement, (event.run_id, event.position, topic, state)))
    else:
        (next_id,) = store.query("SELECT COALESCE(MAX(notification_id), 0) + 1 FROM batonledger_events")[0]
        statement = (
            "INSERT INTO batonledger_events (originator_id, originator_version, topic, state, notification_id) "
            "VALUES (?, ?, ?, ?, ?)"
        )
        store.execute((statement, (event.run_id, event.position, topic, state, next_id)))


def audited(ledgers: LedgerFactory) -> list[Problem]:
    report = audit_store(ledgers())
    assert report.runs_checked == 2
    assert all(p.run_id == RUN for p in report.problems), "the bystander run is untouched"
    assert report.ok == (not report.problems)
    return report.problems


def first(problems: list[Problem]) -> tuple[int, str]:
    assert problems, "the audit found nothing"
    return problems[0].position, problems[0].code


def prepared(ledgers: LedgerFactory) -> RunLedger:
    ledger = ledgers(ManualClock(T0))
    short_run(ledger)
    short_run(ledger, OTHER)
    report = audit_store(ledger)
    assert (report.ok, report.runs_checked, report.events_checked) == (True, 2, 10)
    return ledger


def test_one_changed_byte_is_a_digest_mismatch_at_its_position(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given a valid store, when one byte of event 4 changes (x=1 -> x=2), then digest_mismatch at 4."""
    prepared(ledgers)
    original = store.state_bytes(RUN, 4)
    assert original.count(b'"x":1') == 1

    tampered(store, set_state(store, 4, original.replace(b'"x":1', b'"x":2')))

    assert first(audited(ledgers)) == (4, "digest_mismatch")


def test_deleted_events_are_a_gap_or_a_head_mismatch(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given a valid store, when event 3 of one run and the last event of another are deleted, then position_gap
    at 3 in the first, and head_mismatch at 5 in the second (its shorter chain still verifies), where the
    deleted event's submission row points past the log's head."""
    prepared(ledgers)
    delete = f"DELETE FROM {store.events_table} WHERE originator_id = ? AND originator_version = ?"

    tampered(store, (delete, (RUN, 3)), (delete, (OTHER, 5)))

    report = audit_store(ledgers())
    problems = [(p.run_id, p.position, p.code) for p in report.problems]
    assert [p for p in problems if p[0] == OTHER] == [(OTHER, 5, "head_mismatch"), (OTHER, 5, "submission_past_head")]
    assert next(p for p in problems if p[0] == RUN) == (RUN, 3, "position_gap")


def test_two_swapped_events_are_a_swap_at_the_first(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given a valid store, when events 3 and 4 trade places in the table, then position_swap at 3 and nothing else."""
    prepared(ledgers)
    third, fourth = store.state_bytes(RUN, 3), store.state_bytes(RUN, 4)

    tampered(store, set_state(store, 3, fourth), set_state(store, 4, third))

    assert [(p.position, p.code) for p in audited(ledgers)] == [(3, "position_swap")]


def test_a_forged_suffix_rechained_without_the_original_predecessor(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given events 4-5 replaced by a consistent forged chain on a made-up predecessor, then broken_link at 4."""
    ledger = prepared(ledgers)
    log = list(ledger.history(RUN))
    body = msgspec.structs.replace(log[3].body, result={"x": 99})
    submission = Submission("forged", RUN, "A", ReleaseLease(), 1)
    forged = seal(RUN, 3, "sha256:" + "f" * 64, submission, 1, [body, log[4].body], T0)

    tampered(store, *(set_state(store, event.position, msgspec.json.encode(event)) for event in forged))

    problems = audited(ledgers)
    assert first(problems) == (4, "broken_link")
    assert (5, "head_mismatch") in {(p.position, p.code) for p in problems}


def test_an_event_from_a_stale_epoch_inserted_directly(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given B took epoch 2 from A, when A's epoch-1 intent is inserted (correctly chained) past the fence, then
    stale_epoch at that position, and neither the run row nor the submission rows know it."""
    clock = ManualClock(T0)
    ledger = ledgers(clock)
    short_run(ledger)
    short_run(ledger, OTHER)
    clock.advance(seconds=3600)
    assert Submitter(ledger, RUN, "B").acquire().verdict == "accepted"  # LeaseExpired + LeaseGranted: 6, 7
    head = ledger.state(RUN)
    late = intent("late", kind="effect")
    submission = Submission("a-late", RUN, "A", late, 1)
    (stale,) = seal(RUN, head.version, head.head_digest, submission, 1, [intent_recorded(late)], clock.now())

    insert(store, stale)

    problems = audited(ledgers)
    assert first(problems) == (8, "stale_epoch")
    assert {(p.position, p.code) for p in problems} == {
        (8, "stale_epoch"),
        (8, "head_mismatch"),
        (8, "submission_mismatch"),
    }


def intent_recorded(command: RecordIntent) -> IntentRecorded:
    """The IntentRecorded ``decide`` would make for ``command`` (charge: one call plus the argument bytes)."""
    size = len(canonical_bytes(command.context.arguments, opaque=True)) - 1
    return IntentRecorded(
        command.op_id,
        command.kind,
        command.tool_contract,
        command.context,
        context_digest(command.context),
        command.idempotency_key,
        Usage(calls=1, argument_bytes=size),
    )


def test_the_audit_in_several_processes_reports_what_one_process_reports(
    ledgers: LedgerFactory, store: RawStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given six runs, one altered, one cut short, one with no events left and one with no run row, when
    the store is audited in 2 and in 3 processes, then the report is exactly the single process's."""
    ledger = ledgers(ManualClock(T0))
    runs = [f"run-{n}" for n in range(6)]
    for run_id in runs:
        short_run(ledger, run_id)
    delete = f"DELETE FROM {store.events_table} WHERE originator_id = ?"
    original = store.state_bytes("run-1", 4)
    alter = f"UPDATE {store.events_table} SET state = ? WHERE originator_id = ? AND originator_version = ?"
    tampered(
        store,
        (alter, (original.replace(b'"x":1', b'"x":2'), "run-1", 4)),
        (delete + " AND originator_version = ?", ("run-2", 5)),
        (delete, ("run-4",)),
        ("DELETE FROM baton_runs WHERE run_id = ?", ("run-5",)),
    )
    serial = audit_store(ledger)
    assert {p.run_id for p in serial.problems} == {"run-1", "run-2", "run-4", "run-5"}
    monkeypatch.setattr(audit_runner, "PARALLEL_MIN_EVENTS", 0)  # these runs are tiny
    for jobs in (2, 3):
        parallel = audit_store(ledger, jobs=jobs, store=store.url)
        assert msgspec.to_builtins(parallel) == msgspec.to_builtins(serial), jobs


def test_the_read_streams_every_row_in_order_and_a_read_closed_early_leaves_the_ledger_usable(
    ledgers: LedgerFactory,
) -> None:
    """Given two runs, when they are read in pages smaller than a run, then every row in run and position
    order; when a read is closed after one row, then the next read of the same ledger still gets every row."""
    ledger = ledgers(ManualClock(T0))
    for run_id in (RUN, OTHER):
        short_run(ledger, run_id)
    every = [(run_id, int(msgspec.json.decode(data)["position"])) for run_id, data in stored_rows(ledger, itersize=2)]
    assert every == [(run_id, position) for run_id in sorted((RUN, OTHER)) for position in range(1, 6)]
    with contextlib.closing(stored_rows(ledger, itersize=2)) as stream:
        assert next(stream)[0] == min(RUN, OTHER)
    assert len(list(stored_rows(ledger))) == 10
    assert audit_store(ledger).ok


# -- the store's rows beside the log: a cut with the run row fixed up -------------------------------


def fix_up_run_row(store: RawStore, run_id: str, head: int, **columns: object) -> tuple[str, tuple[object, ...]]:
    """The run row set to end at ``head`` (its digest from the event there), and any other columns given."""
    digest = msgspec.json.decode(store.state_bytes(run_id, head))["digest"]
    names = ["head", "head_digest", *columns]
    assignments = ", ".join(f"{name} = ?" for name in names)
    return f"UPDATE baton_runs SET {assignments} WHERE run_id = ?", (head, digest, *columns.values(), run_id)


def test_a_cut_tail_with_the_run_row_fixed_up_is_found_by_the_submission_rows(
    ledgers: LedgerFactory, store: RawStore
) -> None:
    """Given events 4-5 deleted and the run row set to end at 3 with 3's digest (the anchor agrees with the
    shorter chain), then submission_past_head at 4 (5's submission row still points there), and run_row_mismatch
    at 3 while the row keeps the stage the deleted transition reached; fixed up too, only the submission row."""
    prepared(ledgers)
    delete = f"DELETE FROM {store.events_table} WHERE originator_id = ? AND originator_version >= ?"
    tampered(store, (delete, (RUN, 4)))
    store.execute(fix_up_run_row(store, RUN, 3))

    problems = audited(ledgers)

    assert [(p.position, p.code) for p in problems] == [(3, "run_row_mismatch"), (4, "submission_past_head")]
    assert "stage 'CANDIDATE_READY' (the log: 'GENERATING')" in problems[0].detail
    assert "position 5; the log ends at 3" in problems[1].detail

    store.execute(fix_up_run_row(store, RUN, 3, stage="GENERATING"))

    assert [(p.position, p.code) for p in audited(ledgers)] == [(4, "submission_past_head")]


def test_events_added_behind_the_ledger_with_the_run_row_fixed_up_have_no_submission_row(
    ledgers: LedgerFactory, store: RawStore
) -> None:
    """Given a correctly chained event inserted after the head and the run row moved to it, then
    submission_mismatch at 6: no submission the ledger accepted recorded it."""
    ledger = prepared(ledgers)
    head = ledger.state(RUN)
    submission = Submission("forged", RUN, "A", RecordTransition(Stage.VERIFYING, "sha256:" + "ab" * 32), 1)
    (added,) = seal(RUN, head.version, head.head_digest, submission, 1, decide(head, submission, T0), T0)
    insert(store, added)
    store.execute(fix_up_run_row(store, RUN, 6, stage="VERIFYING"))

    assert [(p.position, p.code) for p in audited(ledgers)] == [(6, "submission_mismatch")]
