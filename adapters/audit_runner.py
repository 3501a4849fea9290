"""The audit of a store and of an export, as library calls (``baton audit`` / ``verify-export`` run them).

The audit reads the stored bytes of every run in one ordered scan (``originator_id``, then
position), feeds them to ``projections.audit.AuditFold`` one run at a time and anchors each run's
head to its run row, and compares the row's other columns and the run's last submission row with
the log; a large PostgreSQL store is split into key ranges of whole runs, one process each, joined
in key order, so the report is the one a single process gives. A run's stored resume snapshots are
handed to its fold, which compares each with the fold at its position.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, wait
from typing import Any, BinaryIO, NamedTuple

import msgspec
from eventsourcing.persistence import PersistenceError
from pydantic import ValidationError

from baton.adapters.bootstrap import open_ledger
from baton.adapters.eventstore import RunLedger
from baton.adapters.eventstore.audit_reader import (
    KeyRange,
    key_ranges,
    last_submissions,
    snapshot_runs,
    stored_rows,
    stored_snapshots,
)
from baton.adapters.eventstore.fenced import RunRow
from baton.adapters.export import check_statement
from baton.adapters.identity import RegistryHistory
from baton.domain.errors import BatonError, StoreUnavailable
from baton.domain.events import RecordedEvent
from baton.domain.export_head import HEAD_STATEMENT
from baton.domain.identity import REGISTRY_RUN
from baton.projections.audit import AuditFold, Problem
from baton.projections.audit_anchors import LastSubmission, RowClaims

__all__ = [
    "AUDIT_ERRORS",
    "DEFAULT_JOBS",
    "PARALLEL_MIN_EVENTS",
    "AuditReport",
    "ExportReport",
    "audit_store",
    "verify_export",
]

PARALLEL_MIN_EVENTS = 50_000  # below this, starting worker processes costs more than they save
# One process more than the CPUs (at most 4): a process waiting for its next chunk of rows from the
# server leaves its CPU to another (docs/benchmarks.md, "Audit").
DEFAULT_JOBS = min(4, (os.cpu_count() or 1) + 1)
_TICK = 1024  # events between progress updates
_generic = msgspec.json.Decoder()
# what an audit reports as a failure to read the store or the file, not as a problem found in it
AUDIT_ERRORS = (PersistenceError, BatonError, ValidationError, OSError, msgspec.DecodeError)


class AuditReport(msgspec.Struct):
    ok: bool = True
    runs_checked: int = 0
    events_checked: int = 0
    problems: list[Problem] = msgspec.field(default_factory=list)
    # whether the store's registry verifies identities, so each event's signature was checked
    identities_verified: bool = False


# -- the audit of a store ----------------------------------------------------------------------


def audit_store(
    ledger: RunLedger,
    run_id: str | None = None,
    *,
    progress: Callable[[int], None] | None = None,
    jobs: int = 1,
    store: str | None = None,
) -> AuditReport:
    """Audit every run (or one): each run's events through an ``AuditFold``, its head against its run row.

    With ``jobs > 1`` and ``store`` given, an audit of every run on PostgreSQL of at least
    ``PARALLEL_MIN_EVENTS`` events is split into that many key ranges, each audited by its own process on its own
    connection to ``store`` (the URL ``ledger`` was opened with). Runs are never split, and the
    parts are joined in key order, so the report is the one a single process gives.
    """
    rows = ledger.runs() if run_id is None else [r for r in [ledger.recorder.select_run(run_id)] if r]  # type: ignore[attr-defined]
    anchors = _Anchors({row.run_id: row for row in rows}, last_submissions(ledger, run_id))
    postgres = hasattr(ledger.recorder.datastore, "schema")  # type: ignore[attr-defined]
    # the workers open their own ledgers from ``store``: never split without it, or they could read
    # another store ($BATON_STORE, the default file) and check it against this one's anchors
    if jobs > 1 and store and run_id is None and postgres and sum(r.head for r in rows) >= PARALLEL_MIN_EVENTS:
        parts = _audit_parallel(store, key_ranges(rows, jobs), anchors, progress)
    else:
        parts = [_audit_range(ledger, run_id, (None, None), anchors, progress)]
    report = AuditReport()
    seen: set[str] = set()
    for part, part_seen in parts:
        report.problems.extend(part.problems)
        report.runs_checked += part.runs_checked
        report.events_checked += part.events_checked
        seen |= part_seen
    # a run row whose events are all gone, or snapshots or submission rows of a run with neither
    # events nor a run row
    recorded = anchors.rows.keys() | anchors.submissions.keys() | snapshot_runs(ledger, run_id)
    for missing in sorted(recorded - seen):
        empty = AuditFold(missing, snapshots=stored_snapshots(ledger, missing))
        report.problems.extend(anchors.finish(empty))
        report.runs_checked += 1
    if progress is not None:
        progress(report.events_checked)
    report.ok = not report.problems
    history = registry_history(ledger)
    report.identities_verified = history is not None and history.required
    return report


class _Anchors(NamedTuple):
    """What the store recorded beside the log, by run: the run rows and the last submission rows."""

    rows: dict[str, RunRow]
    submissions: dict[str, LastSubmission]

    def finish(self, fold: AuditFold) -> list[Problem]:
        """The fold's problems, its log compared with the run's rows."""
        row = self.rows.get(fold.run_id)
        if row is None:
            return fold.finish(None, anchored=True, submission=self.submissions.get(fold.run_id))
        claims = RowClaims(row.epoch, row.holder, row.expires_at, row.stage, row.status)
        anchor = (row.head, row.head_digest)
        return fold.finish(anchor, anchored=True, row=claims, submission=self.submissions.get(fold.run_id))


def _audit_range(
    ledger: RunLedger,
    run_id: str | None,
    key_range: KeyRange,
    anchors: _Anchors,
    progress: Callable[[int], None] | None,
) -> tuple[AuditReport, set[str]]:
    """The runs of one ordered scan, each anchored to its run row (if it has one), and the runs seen."""
    report = AuditReport()
    seen: set[str] = set()
    fold: AuditFold | None = None

    def close(fold: AuditFold) -> None:
        report.problems.extend(anchors.finish(fold))
        report.runs_checked += 1
        report.events_checked += fold.events

    authorship = registry_history(ledger)
    with_snapshots = snapshot_runs(ledger, run_id, key_range=key_range)
    current: str | None = None  # the run of ``fold``
    apply: Callable[[bytes], None] | None = None  # its ``apply_stored``
    count = 0
    with contextlib.closing(stored_rows(ledger, run_id, key_range=key_range)) as stream:
        for originator_id, data in stream:
            if originator_id != current or apply is None:
                if fold is not None:
                    close(fold)
                held = stored_snapshots(ledger, originator_id) if originator_id in with_snapshots else None
                fold = AuditFold(originator_id, authorship=authorship, snapshots=held)
                current = originator_id
                apply = fold.apply_stored
                seen.add(originator_id)
            apply(data)
            count += 1
            if progress is not None and not count % _TICK:
                progress(count)
    if fold is not None:
        close(fold)
    return report, seen


def registry_history(ledger: RunLedger) -> RegistryHistory | None:
    """The store's registry over time, to check each event's author by; None for a store without one."""
    events = list(ledger.history(REGISTRY_RUN))
    return RegistryHistory(events) if events else None


def _audit_parallel(
    store: str, ranges: list[KeyRange], anchors: _Anchors, progress: Callable[[int], None] | None
) -> list[tuple[AuditReport, set[str]]]:
    # fork where there is one: the workers inherit the loaded modules (a spawned one would spend
    # about a second of CPU importing them) and touch nothing of the parent but its memory.
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    done = context.Value("q", 0)
    with ProcessPoolExecutor(len(ranges), mp_context=context, initializer=_start_worker, initargs=(done,)) as pool:
        futures = [pool.submit(_audit_part, store, key_range, anchors) for key_range in ranges]
        while wait(futures, timeout=0.1 if progress else None).not_done:
            if progress is not None:
                progress(done.value)
        return [future.result() for future in futures]


_done: Any = None  # in a worker: the events audited by all workers, for the parent's progress bar


def _start_worker(done: Any) -> None:
    global _done  # noqa: PLW0603 - one per worker process, set once at its start
    _done = done


def _audit_part(store: str, key_range: KeyRange, anchors: _Anchors) -> tuple[AuditReport, set[str]]:
    """One key range, in a worker process with its own connection."""
    reported = 0

    def tick(count: int) -> None:
        nonlocal reported
        with _done.get_lock():
            _done.value += count - reported
        reported = count

    try:
        ledger = open_ledger(store, one_shot=True)
        try:
            return _audit_range(ledger, None, key_range, anchors, tick)
        finally:
            ledger.close()
    except AUDIT_ERRORS as exc:  # the parent reports it; a library error may not survive pickling
        raise StoreUnavailable(f"audit worker for {key_range}: {exc}") from None


class ExportReport(AuditReport):
    """An export's verification: the audit's report, and what became of its head statement."""

    # "verified" with the trusted key, "unchecked" (no --trust), "missing", "invalid"
    head_statement: str = "missing"
    store_id: str = ""  # the store the head statement names


class _Line(msgspec.Struct):
    run_id: str = ""
    statement: str = ""  # set on the head statement, the export's last line


_line = msgspec.json.Decoder(_Line)
_envelope = msgspec.json.Decoder(RecordedEvent, strict=False)


def verify_export(lines: BinaryIO, *, expect_head: str | None = None, trust: str | None = None) -> ExportReport:
    """Verify an export with no store: chain, digests and the audit rules over its lines, and its end
    against the head statement the store signed (``adapters.export``), with the key ``trust`` if given.

    An export of a signed store starts with the registry's stream (``baton export`` writes it
    first); its events give each following event's author and key, so every signature is checked
    offline. ``expect_head`` anchors the last run of the file (the exported one).
    """
    report = ExportReport()
    fold: AuditFold | None = None
    history: RegistryHistory | None = None
    registry: list[RecordedEvent] = []
    finished: list[AuditFold] = []
    statement: bytes | None = None
    for line in lines:
        if not line.strip():
            continue
        head = _line.decode(line)
        if head.statement == HEAD_STATEMENT:
            statement = line  # the last one stands: events after it must agree with it too
            continue
        run_id = head.run_id
        if fold is None or run_id != fold.run_id:
            if fold is not None:
                finished.append(fold)
                if fold.run_id == REGISTRY_RUN:
                    history = RegistryHistory(registry)
            fold = AuditFold(run_id, authorship=history)
        fold.apply_stored(line)
        if run_id == REGISTRY_RUN:
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):  # the fold reports it
                registry.append(_envelope.decode(line))
    if fold is None:
        return report
    for earlier in finished:
        report.problems.extend(earlier.finish())
    anchor = (fold.head, expect_head) if expect_head is not None else None
    report.problems.extend(fold.finish(anchor))
    every = [*finished, fold]
    checked = check_statement(statement, [(f.run_id, f.head, f.head_digest) for f in every], trust)
    report.problems.extend(checked.problems)
    report.head_statement, report.store_id = checked.status, checked.store_id
    report.runs_checked = len(every)
    report.events_checked = sum(f.events for f in every)
    report.identities_verified = history is not None and history.required
    report.ok = not report.problems
    return report
