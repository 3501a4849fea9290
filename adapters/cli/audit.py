"""The auditor's commands: ``audit``, ``explain``, ``export``, ``verify-export`` and ``report`` (docs/audit.md).

The audit itself is ``adapters.audit_runner`` (``--all --jobs N`` splits a large PostgreSQL store
into N processes). Exit status as every command's (``app.EXIT_TABLE``): 0 no problem, 1 an unknown
run, 2 usage or an unreadable file, 3 the store unavailable, 4 problems found.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import click
import msgspec

from baton.adapters.audit_runner import (
    DEFAULT_JOBS,
    AuditReport,
    ExportReport,
    audit_store,
    verify_export,
)
from baton.adapters.bootstrap import open_ledger
from baton.adapters.cli.app import Exit, Failed, bad_file, unknown_run
from baton.adapters.cli.options import echo_json, json_option, store_option
from baton.adapters.eventstore import RunLedger
from baton.adapters.eventstore.store_identity import raw_public_key
from baton.adapters.export import write_export
from baton.adapters.report import render_html
from baton.adapters.views import ProgressLine
from baton.projections.explain import explain as explain_run
from baton.projections.report import ReportFold

__all__ = ["COMMANDS", "PROGRESS_MIN_EVENTS"]

PROGRESS_MIN_EVENTS = 10_000  # below this an audit takes well under a second: no bar
_STATEMENT = {
    "verified": "head statement: signed by {0}, verified with the trusted key",
    "unchecked": "head statement: signed by {0}, not checked against a trusted key (give --trust STORE_PUB)",
    "missing": "head statement: none, so nothing vouches for where the export ends",
    "invalid": "head statement: does not verify",
}


def _print_report(report: AuditReport, as_json: bool) -> int:
    if as_json:
        echo_json(report)
    else:
        for p in report.problems:
            click.echo(f"{p.run_id}  position {p.position}  {p.code}: {p.detail}")
        verdict = "ok" if report.ok else f"{len(report.problems)} problems"
        click.echo(
            "identities verified: every signature checked" if report.identities_verified else "identities not verified"
        )
        if isinstance(report, ExportReport):
            click.echo(_STATEMENT[report.head_statement].format(report.store_id))
        click.echo(f"audited {report.runs_checked} runs, {report.events_checked} events: {verdict}")
    return Exit.OK if report.ok else Exit.VERIFICATION


@click.command("audit")
@click.argument("run_id", required=False, metavar="[RUN_ID]")
@click.option("--all", "every", is_flag=True, help="every run in the store")
@json_option
@click.option(
    "--jobs",
    type=int,
    default=DEFAULT_JOBS,
    metavar="N",
    help="processes for --all on PostgreSQL (default: one more than the CPUs, at most 4)",
)
@store_option
def audit(run_id: str | None, every: bool, as_json: bool, jobs: int, store: str | None) -> int:
    """Verify runs: chain, digests, fencing, operations, budgets."""
    if (run_id is None) == (not every):
        raise Failed("give a RUN_ID or --all (not both)")
    with contextlib.closing(open_ledger(store, one_shot=True)) as ledger:
        bar = _progress(ledger, run_id) if not as_json and sys.stderr.isatty() else None
        try:
            report = audit_store(ledger, run_id, progress=bar, jobs=jobs, store=store)
        finally:
            if bar is not None:
                bar.close()
    if run_id is not None and report.runs_checked == 0:
        raise unknown_run(run_id)
    return _print_report(report, as_json)


def _progress(ledger: RunLedger, run_id: str | None) -> ProgressLine | None:
    """A bar on stderr when the audit is long enough to want one."""
    total = sum(row.head for row in ledger.runs() if run_id is None or row.run_id == run_id)
    return ProgressLine(sys.stderr, label="audit", total=total) if total >= PROGRESS_MIN_EVENTS else None


@click.command("explain")
@click.argument("run_id", metavar="RUN_ID")
@click.option("--at", type=int, default=None, metavar="POSITION", help="default: the head")
@json_option
@store_option
def explain(run_id: str, at: int | None, as_json: bool, store: str | None) -> int:
    """A run at a position, in plain sentences."""
    if at is not None and at < 1:
        raise Failed(f"--at {at}: positions start at 1")
    with (
        contextlib.closing(open_ledger(store, one_shot=True)) as ledger,
        contextlib.closing(ledger.history(run_id, upto=at)) as events,
    ):
        explanation = explain_run(events, run_id)
    if explanation.position == 0:
        raise unknown_run(run_id)
    if at is not None and explanation.position < at:
        raise Failed(f"--at {at} is past the head of run {run_id!r} (position {explanation.position})")
    if as_json:
        echo_json(explanation)
    else:
        click.echo("\n".join(explanation.sentences))
    return 0


@click.command("export")
@click.argument("run_id", required=False, metavar="[RUN_ID]")
@click.option("--all", "every", is_flag=True, help="every run in the store")
@click.option("--format", type=click.Choice(["jsonl"]), default="jsonl", expose_value=False, help="JSON Lines")
@click.option("-o", "--output", metavar="FILE", help="file to write (default: stdout)")
@store_option
def export(run_id: str | None, every: bool, output: str | None, store: str | None) -> int:
    """A run's (or every run's) full history, canonical JSON Lines, ending in the store's signed head statement.

    One canonical envelope per line, digest included: removing ``digest`` gives the hashed bytes.
    In a signed store the registry's stream comes first, so verify-export checks every signature.
    The last line states each stream's head, signed with the store's key (`baton store id`).
    """
    if (run_id is None) == (not every):
        raise Failed("give a RUN_ID or --all (not both)")
    with contextlib.closing(open_ledger(store, one_shot=True)) as ledger:
        write_export(ledger, run_id, lambda: click.open_file(output or "-", "wb"))
    return 0


@click.command("verify-export")
@click.argument("file", metavar="FILE")
@click.option("--trust", metavar="STORE_PUB", help="the store's public key, as `baton store id` prints it")
@click.option("--expect-head", metavar="DIGEST", help="the head digest from a trusted channel")
@json_option
def verify_export_file(file: str, trust: str | None, expect_head: str | None, as_json: bool) -> int:
    """Verify an export with no store access: its chain, and with --trust the store's signed head statement."""
    if trust is not None:
        try:
            raw_public_key(trust)
        except ValueError as exc:
            raise Failed(f"--trust: {exc}") from None
    try:
        with Path(file).open("rb") as lines:
            report = verify_export(lines, expect_head=expect_head, trust=trust)
    except (OSError, msgspec.DecodeError) as exc:
        raise bad_file(file, exc) from None
    if report.events_checked == 0:
        raise Failed(f"{file} holds no events")
    return _print_report(report, as_json)


@click.command("report")
@click.argument("run_id", metavar="RUN_ID")
@click.option("-o", "--output", metavar="FILE", help="default: RUN_ID.html")
@store_option
def report(run_id: str, output: str | None, store: str | None) -> int:
    """A run as one self-contained HTML page.

    Timeline, budgets and events, with the audit's problems marked.
    """
    with contextlib.closing(open_ledger(store, one_shot=True)) as ledger:
        fold = ReportFold(run_id)
        with contextlib.closing(ledger.history(run_id)) as events:
            for event in events:
                fold.apply(event)
        if not fold.events:
            raise unknown_run(run_id)
        audited = audit_store(ledger, run_id)
        page = fold.finish(audited.problems)
    path = Path(output or f"{run_id}.html")
    path.write_text(render_html(page), encoding="utf-8")
    verdict = "audit ok" if page.ok else f"audit found {len(page.problems)} problems"
    identities = "identities verified" if audited.identities_verified else "identities not verified"
    click.echo(f"wrote {path}: run {run_id}, {page.head} events, {verdict} ({identities})")
    return 0


COMMANDS = (audit, explain, export, verify_export_file, report)
