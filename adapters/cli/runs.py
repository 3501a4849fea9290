"""Reading runs: ``runs``, ``history``, ``verify``, ``state``, ``budgets`` and ``resume``."""

from __future__ import annotations

import contextlib
from typing import Any

import click
import msgspec

from baton.adapters.bootstrap import open_ledger
from baton.adapters.cli.app import Failed, unknown_run
from baton.adapters.cli.options import (
    echo_json,
    json_option,
    placement_options,
    placement_text,
    plain_text,
    store_option,
    usage_text,
)
from baton.adapters.eventstore import RunLedger
from baton.domain.budgets import COUNTERS
from baton.domain.canonical import short
from baton.domain.events import Placement, RecordedEvent
from baton.domain.identity import REGISTRY_RUN
from baton.domain.state import Lease
from baton.domain.times import utc_text
from baton.projections import DIMENSIONS, BudgetUsageFold, classify, portable_state
from baton.projections.portable_state import PortableState
from baton.projections.replay import PrefixOutline
from baton.projections.resumability import resume_point, summary_of

__all__ = ["COMMANDS", "history_record"]

RUN_ID = click.argument("run_id")


@click.command("runs")
@json_option
@store_option
def runs(as_json: bool, store: str | None) -> int:
    """List runs (not the principal registry's stream: ``baton principals list`` shows it)."""
    with contextlib.closing(open_ledger(store, one_shot=True)) as ledger:
        rows = [row for row in ledger.runs() if row.run_id != REGISTRY_RUN]
        verified = ledger.state(REGISTRY_RUN).signatures_required
    if as_json:
        for row in rows:
            echo_json(
                {
                    "run_id": row.run_id,
                    "events": row.head,
                    "epoch": row.epoch,
                    "owner": row.holder,
                    "stage": row.stage,
                    "status": row.status,
                    "lease_expires_at": utc_text(row.expires_at) if row.expires_at else None,
                }
            )
        return 0
    click.echo(f"{'run':<24} {'events':>7} {'epoch':>5}  {'owner':<12} {'stage':<24} status")
    for row in rows:
        click.echo(
            f"{row.run_id:<24} {row.head:>7} {row.epoch:>5}  {row.holder or '-':<12} {row.stage:<24} {row.status}"
        )
    click.echo("identities verified: every event is signed" if verified else "identities not verified")
    return 0


def history_record(event: RecordedEvent) -> dict[str, Any]:
    """The ``history --json`` line: envelope fields first, then the event body."""
    body = msgspec.to_builtins(event.body)
    body.pop("type", None)
    return {
        "position": event.position,
        "type": event.type,
        "epoch": event.epoch,
        "worker": event.worker,
        "submission_id": event.submission_id,
        "recorded_at": utc_text(event.recorded_at),
        "digest": event.digest,
        "prev_digest": event.prev_digest,
        "body": body,
    }


@click.command("history")
@RUN_ID
@json_option
@store_option
def history(run_id: str, as_json: bool, store: str | None) -> int:
    """Every event of a run."""
    found = False
    with contextlib.closing(open_ledger(store, one_shot=True)) as ledger:
        for event in ledger.history(run_id):
            found = True
            if as_json:
                echo_json(history_record(event))
            else:
                click.echo(
                    f"{event.position:>5}  {utc_text(event.recorded_at)}  {event.type:<20} {event.worker:<12} "
                    f"{event.epoch:>5}  {short(event.digest)} <- {short(event.prev_digest)}"
                )
    if not found:
        raise unknown_run(run_id)
    return 0


@click.command("verify")
@RUN_ID
@store_option
def verify(run_id: str, store: str | None) -> int:
    """Verify a run's hash chain."""
    with contextlib.closing(open_ledger(store, one_shot=True)) as ledger:
        report = ledger.verify(run_id)
    if report.events == 0:
        raise unknown_run(run_id)
    click.echo(f"run {run_id}: {report.events} events, chain verified, head {report.head_digest}")
    return 0


@click.command("state")
@RUN_ID
@click.option(
    "--at", type=int, default=None, metavar="POSITION", help="a position of the run, 1 to its head (default: the head)"
)
@json_option
@store_option
def state(run_id: str, at: int | None, as_json: bool, store: str | None) -> int:
    """The portable state of a run at a position.

    Time travel: the fold of the run's events up to --at. A position outside the run is refused.
    """
    if at is not None and at < 1:
        raise Failed(f"--at {at}: positions start at 1")
    with contextlib.closing(open_ledger(store, one_shot=True)) as ledger:
        events = list(ledger.history(run_id, upto=at))
    if not events:
        raise unknown_run(run_id)
    if at is not None and events[-1].position < at:
        raise Failed(f"--at {at} is past the head of run {run_id!r} (position {events[-1].position})")
    checkpoint = portable_state(events, run_id)
    if as_json:
        echo_json(checkpoint)
        return 0
    fields = msgspec.structs.asdict(checkpoint)
    fields["usage"] = usage_text(checkpoint.usage, checkpoint.ceilings)
    del fields["ceilings"]  # shown with the usage, as used/ceiling
    fields["placement"] = placement_text(checkpoint.placement) if checkpoint.placement else None
    for name, value in fields.items():
        click.echo(f"{name:<26} {plain_text(value)}")
    return 0


@click.command("budgets")
@click.option("--run", "run_id", metavar="RUN_ID", help="one run only (default: every run)")
@click.option("--by", type=click.Choice(list(DIMENSIONS)), default="run", show_default=True, help="roll up by")
@json_option
@store_option
def budgets(run_id: str | None, by: str, as_json: bool, store: str | None) -> int:
    """Cumulative budget usage, per run or rolled up.

    Folded from the whole log in global order.
    """
    fold = BudgetUsageFold()
    with contextlib.closing(open_ledger(store, one_shot=True)) as ledger:
        if run_id is None:
            for _, event in ledger.all_events():
                fold.apply(event)
        else:
            with contextlib.closing(ledger.history(run_id)) as events:
                for event in events:
                    fold.apply(event)
    rows = fold.by(by)  # type: ignore[arg-type]  # click.Choice admits only DIMENSIONS
    if run_id is not None and not rows:
        raise unknown_run(run_id)
    if as_json:
        for key, usage in rows.items():
            echo_json({by: key, **msgspec.to_builtins(usage)})
        return 0
    click.echo(f"{by:<24} " + " ".join(f"{name:>14}" for name in COUNTERS))
    for key, usage in rows.items():
        click.echo(f"{key or '-':<24} " + " ".join(f"{getattr(usage, name):>14}" for name in COUNTERS))
    return 0


@click.command("resume")
@RUN_ID
@click.option("--worker", required=True, help="the worker that would resume the run")
@placement_options(worker="worker")
@json_option
@click.option(
    "--prefix", "with_prefix", is_flag=True, help="with --json: every step of the replay prefix, not its summary"
)
@click.option("--no-snapshots", is_flag=True, help="fold the whole history (audit, benchmarks)")
@store_option
def resume(
    run_id: str, placement: Placement, as_json: bool, with_prefix: bool, no_snapshots: bool, store: str | None
) -> int:
    """What resuming a run on a target placement needs.

    The resumability class and its reasons, the checkpoint, the budgets and the replay prefix: its
    summary (steps, first and last position, the chain digest at the head), or with --prefix every step.
    """
    with contextlib.closing(open_ledger(store, one_shot=True)) as ledger:
        fold = ledger.resume_fold(run_id, snapshots=not no_snapshots)
        if fold.run.version == 0:
            raise unknown_run(run_id)
        summary = summary_of(fold)
        now = ledger.clock.now()
        verdict = classify(summary, placement, now)
        point = resume_point(summary.state, placement.worker)
        checkpoint = fold.snapshot()
        lease_case = _lease_case(ledger, fold.run.lease, now)
        replay_prefix: Any = _prefix_summary(summary.prefix, checkpoint)
        if as_json and with_prefix:
            replay_prefix = list(ledger.replay_steps(run_id, summary.prefix))
    if as_json:
        echo_json(
            {
                "run_id": run_id,
                "resumability": {"class": str(verdict.cls), "reasons": list(verdict.reasons)},
                "checkpoint": msgspec.to_builtins(checkpoint),
                "budgets": {
                    "usage": msgspec.to_builtins(checkpoint.usage),
                    "ceilings": msgspec.to_builtins(checkpoint.ceilings),
                },
                "replay_prefix": msgspec.to_builtins(replay_prefix),
                "replay_after_position": summary.prefix.start,
                "uncertain": msgspec.to_builtins(summary.prefix.uncertain),
                "resume_from": msgspec.to_builtins(point),
                "lease": lease_case,
            }
        )
        return 0
    click.echo(f"run {run_id}: {verdict.cls} for {placement.worker}")
    for reason in verdict.reasons:
        click.echo(f"  - {reason}")
    click.echo(f"lease: {_lease_text(lease_case)}")
    click.echo(f"checkpoint {checkpoint.checkpoint_id} {checkpoint.checkpoint_hash}")
    click.echo(f"replay prefix: {summary.prefix.length} operations; uncertain: {len(summary.prefix.uncertain)}")
    owed = "owed before new work" if point.required else "not owed"
    if with_prefix:
        click.echo("(--prefix prints the steps with --json)")
    click.echo(f"resume_from: position {point.position} digest {point.prefix_digest} ({owed})")
    return 0


def _prefix_summary(outline: PrefixOutline, checkpoint: PortableState) -> dict[str, Any]:
    """The replay prefix in constant space, whatever the run's length: its settled steps lie in
    positions ``first_position`` to ``last_position`` (the head), and ``digest``, the chain digest
    at the head, commits to every one of them (``--prefix`` prints the steps themselves)."""
    return {
        "steps": outline.length,
        "first_position": outline.start + 1 if outline.length else None,
        "last_position": checkpoint.position,
        "digest": checkpoint.head_digest,
    }


def _lease_case(ledger: RunLedger, lease: Lease | None, now: int) -> dict[str, Any]:
    """Which case a new worker acquiring the lease meets: ``none`` or ``expired`` (it takes it),
    ``session_gone`` (the store saw the holder's liveness session end: it takes it before the ttl),
    or ``live`` (refused ``lease_held`` until ``expires_at``). The store is asked only about a live
    lease that declared a session, as the write path does."""
    if lease is None:
        return {"status": "none"}
    status = "expired" if now >= lease.expires_at else "live"
    if status == "live" and lease.session and not ledger.session_alive(lease.session):
        status = "session_gone"
    return {
        "status": status,
        "holder": lease.worker,
        "epoch": lease.epoch,
        "expires_at": utc_text(lease.expires_at),
        "session": bool(lease.session),
    }


def _lease_text(case: dict[str, Any]) -> str:
    status = case["status"]
    if status == "none":
        return "none (a new worker takes it at once)"
    held = f"epoch {case['epoch']} held by {case['holder']}"
    if status == "expired":
        return f"expired at {case['expires_at']} ({held}): a new worker takes it at epoch {case['epoch'] + 1}"
    if status == "session_gone":
        return f"holder's session gone ({held}): a new worker takes it now, at epoch {case['epoch'] + 1}"
    liveness = "" if case["session"] else "; no liveness session declared"
    return f"lease live until {case['expires_at']} ({held}{liveness})"


COMMANDS = (runs, history, verify, state, budgets, resume)
