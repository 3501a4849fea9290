"""``baton audit``, ``explain``, ``export`` and ``verify-export``: the auditor's commands (issue 7).

The audit itself is ``adapters.audit_runner`` (``--all --jobs N`` splits a large PostgreSQL store
into N processes). Exit status: 0 no problem, 1 problems found, 2 usage, store or file errors.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

import msgspec

from baton.adapters.audit_runner import AUDIT_ERRORS, DEFAULT_JOBS, AuditReport, audit_store, verify_export
from baton.adapters.bootstrap import open_ledger
from baton.adapters.eventstore import RunLedger
from baton.adapters.eventstore.audit_reader import stored_rows
from baton.adapters.report import add_report_parser
from baton.adapters.views import ProgressLine
from baton.domain.canonical import canonical_bytes
from baton.projections.explain import explain

__all__ = ["add_audit_parsers"]

EXIT_OK, EXIT_PROBLEMS, EXIT_ERROR = 0, 1, 2
PROGRESS_MIN_EVENTS = 10_000  # below this an audit takes well under a second: no bar
_json = msgspec.json.Encoder()
_generic = msgspec.json.Decoder()


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


def cmd_audit(args: argparse.Namespace) -> int:
    if (args.run_id is None) == (not args.all):
        return _fail("give a RUN_ID or --all (not both)")
    try:
        ledger = open_ledger(args.store, one_shot=True)
        try:
            return _audit(ledger, args)
        finally:
            ledger.close()
    except AUDIT_ERRORS as exc:
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
    except AUDIT_ERRORS as exc:
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
    except (*AUDIT_ERRORS, TypeError, ValueError) as exc:
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
        default=DEFAULT_JOBS,
        metavar="N",
        help="processes for --all on PostgreSQL (default: one more than the CPUs, at most 4)",
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
