"""``baton audit``, ``explain``, ``export`` and ``verify-export``: the auditor's commands (issue 7).

The audit reads the stored bytes of every run in one ordered scan (``originator_id``, then
position), feeds them to ``projections.audit.AuditFold`` one run at a time and anchors each run's
head to its run row; ``--all --jobs N`` splits a large PostgreSQL store into N key ranges of whole
runs, one process each, joined in key order. Exit status: 0 no problem, 1 problems found, 2 usage,
store or file errors.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
from eventsourcing.persistence import PersistenceError
from pydantic import ValidationError

from adapters.bootstrap import open_ledger
from adapters.eventstore import RunLedger
from adapters.eventstore.audit_reader import KeyRange, key_ranges, stored_rows
from adapters.report import add_report_parser
from adapters.views import ProgressLine
from domain.canonical import canonical_bytes
from domain.errors import BatonError, StoreUnavailable
from projections.audit import AuditFold, Problem
from projections.explain import explain

__all__ = ["AuditReport", "add_audit_parsers", "audit_store", "stored_rows", "verify_export"]

EXIT_OK, EXIT_PROBLEMS, EXIT_ERROR = 0, 1, 2
PROGRESS_MIN_EVENTS = 10_000  # below this an audit takes well under a second: no bar
PARALLEL_MIN_EVENTS = 50_000  # below this, starting worker processes costs more than they save
_TICK = 1024  # events between progress updates
_json = msgspec.json.Encoder()
_generic = msgspec.json.Decoder()


class AuditReport(msgspec.Struct):
    ok: bool = True
    runs_checked: int = 0
    events_checked: int = 0
    problems: list[Problem] = msgspec.field(default_factory=list)


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

    With ``jobs > 1`` an audit of every run on PostgreSQL of at least ``PARALLEL_MIN_EVENTS``
    events is split into that many key ranges, each audited by its own process on its own
    connection to ``store`` (the URL ``ledger`` was opened with). Runs are never split, and the
    parts are joined in key order, so the report is the one a single process gives.
    """
    rows = ledger.runs() if run_id is None else [r for r in [ledger.recorder.select_run(run_id)] if r]  # type: ignore[attr-defined]
    anchors = {row.run_id: (row.head, row.head_digest) for row in rows}
    postgres = hasattr(ledger.recorder.datastore, "schema")  # type: ignore[attr-defined]
    if jobs > 1 and run_id is None and postgres and sum(r.head for r in rows) >= PARALLEL_MIN_EVENTS:
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
    for missing in sorted(anchors.keys() - seen):  # a run row whose events are all gone
        empty = AuditFold(missing)
        report.problems.extend(empty.finish(anchors[missing]))
        report.runs_checked += 1
    if progress is not None:
        progress(report.events_checked)
    report.ok = not report.problems
    return report


_Anchors = dict[str, tuple[int, str]]


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
        report.problems.extend(fold.finish(anchors.get(fold.run_id), anchored=True))
        report.runs_checked += 1
        report.events_checked += fold.events

    with contextlib.closing(stored_rows(ledger, run_id, key_range=key_range)) as stream:
        for count, (originator_id, data) in enumerate(stream, start=1):
            if fold is None or originator_id != fold.run_id:
                if fold is not None:
                    close(fold)
                fold = AuditFold(originator_id)
                seen.add(originator_id)
            fold.apply_stored(data)
            if progress is not None and count % _TICK == 0:
                progress(count)
    if fold is not None:
        close(fold)
    return report, seen


def _audit_parallel(
    store: str | None, ranges: list[KeyRange], anchors: _Anchors, progress: Callable[[int], None] | None
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


def _audit_part(store: str | None, key_range: KeyRange, anchors: _Anchors) -> tuple[AuditReport, set[str]]:
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
    except _ERRORS as exc:  # the parent reports it; a library error may not survive pickling
        raise StoreUnavailable(f"audit worker for {key_range}: {exc}") from None


def verify_export(lines: BinaryIO, *, expect_head: str | None = None) -> AuditReport:
    """Verify an export with no store: chain, digests and the audit rules over its lines."""
    report = AuditReport()
    fold: AuditFold | None = None
    for line in lines:
        if not line.strip():
            continue
        if fold is None:
            first = _generic.decode(line)
            fold = AuditFold(str(first.get("run_id", "")) if isinstance(first, dict) else "")
        fold.apply_stored(line)
    if fold is None:
        return report
    anchor = (fold.head, expect_head) if expect_head is not None else None
    report.problems = fold.finish(anchor)
    report.runs_checked, report.events_checked = 1, fold.events
    report.ok = not report.problems
    return report


# -- commands -----------------------------------------------------------------------------------


def _print_report(report: AuditReport, as_json: bool) -> int:
    if as_json:
        print(_json.encode(report).decode())
    else:
        for p in report.problems:
            print(f"{p.run_id}  position {p.position}  {p.code}: {p.detail}")
        verdict = "ok" if report.ok else f"{len(report.problems)} problems"
        print(f"audited {report.runs_checked} runs, {report.events_checked} events: {verdict}")
    return EXIT_OK if report.ok else EXIT_PROBLEMS


def _fail(message: str) -> int:
    print(f"baton: {message}", file=sys.stderr)
    return EXIT_ERROR


_ERRORS = (PersistenceError, BatonError, ValidationError, OSError, msgspec.DecodeError)


def cmd_audit(args: argparse.Namespace) -> int:
    if (args.run_id is None) == (not args.all):
        return _fail("give a RUN_ID or --all (not both)")
    try:
        ledger = open_ledger(args.store, one_shot=True)
        try:
            return _audit(ledger, args)
        finally:
            ledger.close()
    except _ERRORS as exc:
        return _fail(f"audit failed: {exc}")


def _audit(ledger: RunLedger, args: argparse.Namespace) -> int:
    bar: ProgressLine | None = None
    if not args.json and sys.stderr.isatty():
        rows = ledger.runs()
        total = sum(row.head for row in rows if args.run_id is None or row.run_id == args.run_id)
        if total >= PROGRESS_MIN_EVENTS:
            bar = ProgressLine(sys.stderr, label="audit", total=total)
    try:
        report = audit_store(ledger, args.run_id, progress=bar, jobs=args.jobs, store=args.store)
    finally:
        if bar is not None:
            bar.close()
    if args.run_id is not None and report.runs_checked == 0:
        return _fail(f"no events and no run row for run {args.run_id!r}")
    return _print_report(report, args.json)


def cmd_explain(args: argparse.Namespace) -> int:
    try:
        ledger = open_ledger(args.store, one_shot=True)
        try:
            with contextlib.closing(ledger.history(args.run_id, upto=args.at)) as events:
                explanation = explain(events, args.run_id)
        finally:
            ledger.close()
    except _ERRORS as exc:
        return _fail(f"explain failed: {exc}")
    if explanation.position == 0:
        return _fail(f"no events for run {args.run_id!r}")
    if args.json:
        print(_json.encode(explanation).decode())
    else:
        print("\n".join(explanation.sentences))
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    """One canonical envelope per line, digest included: removing ``digest`` gives the hashed bytes."""
    try:
        ledger = open_ledger(args.store, one_shot=True)
        out = open(args.output, "wb") if args.output else sys.stdout.buffer  # noqa: SIM115 - closed below
        try:
            written = 0
            with contextlib.closing(stored_rows(ledger, args.run_id)) as stream:
                for _, data in stream:
                    out.write(canonical_bytes(_generic.decode(data)))
                    written += 1
        finally:
            ledger.close()
            if args.output:
                out.close()
    except (*_ERRORS, TypeError, ValueError) as exc:
        return _fail(f"export failed: {exc}")
    if not written:
        return _fail(f"no events for run {args.run_id!r}")
    return EXIT_OK


def cmd_verify_export(args: argparse.Namespace) -> int:
    try:
        with Path(args.file).open("rb") as lines:
            report = verify_export(lines, expect_head=args.expect_head)
    except (OSError, msgspec.DecodeError) as exc:
        return _fail(f"cannot read {args.file}: {exc}")
    if report.events_checked == 0:
        return _fail(f"{args.file} holds no events")
    return _print_report(report, args.json)


def add_audit_parsers(sub: Any, store: argparse.ArgumentParser) -> None:
    """Register the auditor's subcommands on ``baton``'s subparsers."""
    audit = sub.add_parser("audit", parents=[store], help="verify runs: chain, digests, fencing, operations, budgets")
    audit.add_argument("run_id", nargs="?", metavar="RUN_ID")
    audit.add_argument("--all", action="store_true", help="every run in the store")
    audit.add_argument("--json", action="store_true")
    audit.add_argument(
        "--jobs",
        type=int,
        default=min(4, os.cpu_count() or 1),
        metavar="N",
        help="processes for --all on PostgreSQL (default: the CPUs, at most 4)",
    )
    audit.set_defaults(func=cmd_audit)
    explain_cmd = sub.add_parser("explain", parents=[store], help="a run at a position, in plain sentences")
    explain_cmd.add_argument("run_id", metavar="RUN_ID")
    explain_cmd.add_argument("--at", type=int, default=None, metavar="POSITION", help="default: the head")
    explain_cmd.add_argument("--json", action="store_true")
    explain_cmd.set_defaults(func=cmd_explain)
    export = sub.add_parser("export", parents=[store], help="a run's full history, canonical JSON Lines")
    export.add_argument("run_id", metavar="RUN_ID")
    export.add_argument("--format", choices=["jsonl"], default="jsonl")
    export.add_argument("-o", "--output", help="file to write (default: stdout)")
    export.set_defaults(func=cmd_export)
    verify = sub.add_parser("verify-export", help="verify an export with no store access")
    verify.add_argument("file", metavar="FILE")
    verify.add_argument("--expect-head", metavar="DIGEST", help="the head digest from a trusted channel")
    verify.add_argument("--json", action="store_true")
    verify.set_defaults(func=cmd_verify_export)
    add_report_parser(sub, store, audit=audit_store)
