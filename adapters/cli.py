"""``baton``: a thin command line over the ledger.

Each command decodes its input, calls the ledger and prints; errors map to exit codes in one table.
Without ``--store`` (and without ``BATON_STORE``) every command uses the embedded default, the
SQLite file ``baton.db`` in the current directory.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import msgspec
from eventsourcing.persistence import PersistenceError
from pydantic import ValidationError

from baton.adapters.bootstrap import init_store, open_ledger, open_views
from baton.adapters.cli_args import add_placement_arguments, placement_from
from baton.adapters.cli_audit import add_audit_parsers
from baton.adapters.cli_handoff import add_handoff_parsers
from baton.adapters.cli_purge import add_purge_parser
from baton.adapters.demo import run_demo
from baton.adapters.eventstore import RunLedger
from baton.adapters.views import DEFAULT_BATCH, CatchUp, ProgressLine, ViewRunner
from baton.adapters.wire import decode_submission
from baton.domain.budgets import COUNTERS
from baton.domain.canonical import short
from baton.domain.commands import Submission, Verdict
from baton.domain.errors import BatonError, ChainBroken, StoreUnavailable
from baton.domain.events import RecordedEvent
from baton.projections import DIMENSIONS, BudgetUsageFold, classify, portable_state
from baton.projections.resumability import summary_of

__all__ = ["EXIT_CODES", "main"]

# One table from error to exit code; anything else is a bug and exits 70 (EX_SOFTWARE).
EXIT_CODES: dict[type[BaseException], int] = {
    ChainBroken: 4,
    StoreUnavailable: 3,
    BatonError: 1,
    ValidationError: 2,
    PersistenceError: 3,
}

_json = msgspec.json.Encoder()


def _ledger(args: argparse.Namespace) -> RunLedger:
    return open_ledger(args.store, one_shot=True)


def cmd_demo(args: argparse.Namespace) -> int:
    return run_demo(args.store)


def cmd_store_init(args: argparse.Namespace) -> int:
    settings = init_store(args.store)
    print(f"initialised {settings.backend} store {settings.url}")
    return 0


def cmd_submit(args: argparse.Namespace, stdin: TextIO | None = None) -> int:
    """One verdict line per input line; a malformed line is rejected and the stream goes on."""
    ledger = _ledger(args)
    for raw in stdin or sys.stdin:
        line = raw.strip()
        if not line:
            continue
        verdict = _submit_line(ledger, line.encode())
        sys.stdout.write(_json.encode(verdict).decode() + "\n")
        sys.stdout.flush()
    return 0


def _submit_line(ledger: RunLedger, line: bytes) -> Verdict:
    decoded = decode_submission(line)
    return decoded if isinstance(decoded, Verdict) else ledger.submit(decoded)


def cmd_runs(args: argparse.Namespace) -> int:
    rows = _ledger(args).runs()
    if args.json:
        for row in rows:
            print(
                _json.encode(
                    {
                        "run_id": row.run_id,
                        "events": row.head,
                        "epoch": row.epoch,
                        "owner": row.holder,
                        "stage": row.stage,
                        "status": row.status,
                        "lease_expires_at": _iso(row.expires_at) if row.expires_at else None,
                    }
                ).decode()
            )
        return 0
    print(f"{'run':<24} {'events':>7} {'epoch':>5}  {'owner':<12} {'stage':<24} status")
    for row in rows:
        print(f"{row.run_id:<24} {row.head:>7} {row.epoch:>5}  {row.holder or '-':<12} {row.stage:<24} {row.status}")
    return 0


def _iso(micros: int) -> str:
    return dt.datetime.fromtimestamp(micros / 1e6, tz=dt.UTC).isoformat().replace("+00:00", "Z")


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
        "recorded_at": _iso(event.recorded_at),
        "digest": event.digest,
        "prev_digest": event.prev_digest,
        "body": body,
    }


def cmd_history(args: argparse.Namespace) -> int:
    events = _ledger(args).history(args.run_id)
    found = False
    for event in events:
        found = True
        if args.json:
            print(_json.encode(history_record(event)).decode())
        else:
            print(
                f"{event.position:>5}  {_iso(event.recorded_at)}  {event.type:<20} {event.worker:<12} "
                f"{event.epoch:>5}  {short(event.digest)} <- {short(event.prev_digest)}"
            )
    if not found:
        print(f"no events for run {args.run_id!r}", file=sys.stderr)
        return 1
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    report = _ledger(args).verify(args.run_id)
    if report.events == 0:
        print(f"no events for run {args.run_id!r}", file=sys.stderr)
        return 1
    print(f"run {args.run_id}: {report.events} events, chain verified, head {report.head_digest}")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    """What a worker needs to resume: class and reasons, checkpoint, budgets, replay prefix."""
    ledger = _ledger(args)
    fold = ledger.resume_fold(args.run_id, snapshots=not args.no_snapshots)
    if fold.run.version == 0:
        print(f"no events for run {args.run_id!r}", file=sys.stderr)
        return 1
    target = placement_from(args, args.worker)
    summary = summary_of(fold)
    verdict = classify(summary, target, ledger.clock.now())
    checkpoint = fold.snapshot()
    document = {
        "run_id": args.run_id,
        "resumability": {"class": str(verdict.cls), "reasons": list(verdict.reasons)},
        "checkpoint": msgspec.to_builtins(checkpoint),
        "budgets": {
            "usage": msgspec.to_builtins(checkpoint.usage),
            "ceilings": msgspec.to_builtins(checkpoint.ceilings),
        },
        "replay_prefix": msgspec.to_builtins(list(ledger.replay_steps(args.run_id, summary.prefix))),
        "replay_after_position": summary.prefix.start,
        "uncertain": msgspec.to_builtins(summary.prefix.uncertain),
    }
    if args.json:
        print(_json.encode(document).decode())
    else:
        print(f"run {args.run_id}: {verdict.cls} for {args.worker}")
        for reason in verdict.reasons:
            print(f"  - {reason}")
        print(f"checkpoint {checkpoint.checkpoint_id} {checkpoint.checkpoint_hash}")
        print(f"replay prefix: {summary.prefix.length} operations; uncertain: {len(summary.prefix.uncertain)}")
    return 0


def cmd_state(args: argparse.Namespace) -> int:
    """The portable state at a position (time travel): the fold of the first N events."""
    events = list(_ledger(args).history(args.run_id, upto=args.at))
    if not events:
        print(f"no events for run {args.run_id!r}", file=sys.stderr)
        return 1
    checkpoint = portable_state(events, args.run_id)
    if args.json:
        print(_json.encode(checkpoint).decode())
    else:
        for name, value in msgspec.to_builtins(checkpoint).items():
            print(f"{name:<26} {value}")
    return 0


def cmd_budgets(args: argparse.Namespace) -> int:
    """Cumulative usage per run or rolled up, folded from the log in global order."""
    fold = BudgetUsageFold()
    for _, event in _ledger(args).all_events():
        if args.run is None or event.run_id == args.run:
            fold.apply(event)
    rows = fold.by(args.by)
    if args.json:
        for key, usage in rows.items():
            print(_json.encode({args.by: key, **msgspec.to_builtins(usage)}).decode())
        return 0
    print(f"{args.by:<24} " + " ".join(f"{name:>14}" for name in COUNTERS))
    for key, usage in rows.items():
        print(f"{key or '-':<24} " + " ".join(f"{getattr(usage, name):>14}" for name in COUNTERS))
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    target = {"submission": Submission, "verdict": Verdict, "event": RecordedEvent}[args.what]
    print(_json.encode(msgspec.json.schema(target)).decode())
    return 0


def cmd_views_catch_up(args: argparse.Namespace) -> int:
    """Fold the events after the views' tracking position into them, one transaction per batch."""
    with open_views(args.store, batch_size=args.batch_size) as runner:
        if not args.follow:
            _print_views(runner, "caught up", runner.catch_up())
            return 0
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how --follow ends
            runner.follow(threading.Event(), interval=args.interval)
    return 0


def cmd_views_rebuild(args: argparse.Namespace) -> int:
    """Fold the whole log into fresh tables, then swap them in atomically; progress on stderr."""
    with open_views(args.store, batch_size=args.batch_size) as runner:
        progress = ProgressLine(sys.stderr, label="rebuild", total=runner.total_events())
        try:
            done = runner.rebuild(progress=progress)
        finally:
            progress.close()
        _print_views(runner, "rebuilt", done)
    return 0


def _print_views(runner: ViewRunner, verb: str, done: CatchUp) -> None:
    print(
        f"{verb}: {done.events} events in {done.batches} batches ({done.rate:,.0f} events/s), position {done.position}"
    )
    print("  " + ", ".join(f"{table} {rows} rows" for table, rows in runner.counts().items()))


def _partitions(text: str) -> tuple[int, ...]:
    """``0,1,5`` -> (0, 1, 5): the run partitions one ``baton serve`` answers."""
    try:
        parts = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        parts = ()
    if not parts or parts[0] < 0:
        raise argparse.ArgumentTypeError(f"expected partition numbers such as 0,1 (not {text!r})")
    return parts


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve submissions on NATS or Kafka until SIGINT/SIGTERM (adapters/bus, docs/operations.md)."""
    import asyncio  # noqa: PLC0415 (only serve needs it)

    from baton.adapters.bus import serve  # noqa: PLC0415 (faststream and the brokers cost ~0.8 s to import)

    ledger = open_ledger(args.store)
    try:
        asyncio.run(serve(ledger, args.bus, relay=not args.no_relay, partitions=args.partitions))
    except ValueError as exc:  # the bus URL, or partitions on Kafka
        print(f"baton: {exc}", file=sys.stderr)
        return 2
    finally:
        ledger.close()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="baton", description="Baton: the run ledger for movable AI agents.")
    store = argparse.ArgumentParser(add_help=False)
    store.add_argument("--store", help="store URL (default: $BATON_STORE or sqlite:///baton.db)")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("demo", parents=[store], help="run the scripted handover demo").set_defaults(func=cmd_demo)
    store_cmd = sub.add_parser("store", help="store administration").add_subparsers(dest="action", required=True)
    store_cmd.add_parser("init", parents=[store], help="create the schema once").set_defaults(func=cmd_store_init)
    sub.add_parser("submit", parents=[store], help="JSON Lines submissions on stdin -> verdict lines").set_defaults(
        func=cmd_submit
    )
    runs = sub.add_parser("runs", parents=[store], help="list runs")
    runs.add_argument("--json", action="store_true")
    runs.set_defaults(func=cmd_runs)
    history = sub.add_parser("history", parents=[store], help="every event of a run")
    history.add_argument("run_id")
    history.add_argument("--json", action="store_true")
    history.set_defaults(func=cmd_history)
    verify = sub.add_parser("verify", parents=[store], help="verify a run's hash chain")
    verify.add_argument("run_id")
    verify.set_defaults(func=cmd_verify)
    resume = sub.add_parser("resume", parents=[store], help="what resuming a run on a target placement needs")
    resume.add_argument("run_id")
    resume.add_argument("--worker", required=True)
    add_placement_arguments(resume)
    resume.add_argument("--json", action="store_true")
    resume.add_argument("--no-snapshots", action="store_true", help="fold the whole history (audit, benchmarks)")
    resume.set_defaults(func=cmd_resume)
    state = sub.add_parser("state", parents=[store], help="the portable state of a run at a position")
    state.add_argument("run_id")
    state.add_argument("--at", type=int, default=None, help="position (default: the head)")
    state.add_argument("--json", action="store_true")
    state.set_defaults(func=cmd_state)
    budgets = sub.add_parser("budgets", parents=[store], help="cumulative budget usage")
    budgets.add_argument("--run")
    budgets.add_argument("--by", choices=list(DIMENSIONS), default="run")
    budgets.add_argument("--json", action="store_true")
    budgets.set_defaults(func=cmd_budgets)
    schema = sub.add_parser("schema", help="print the JSON Schema of the wire format")
    schema.add_argument("what", nargs="?", default="submission", choices=["submission", "verdict", "event"])
    schema.set_defaults(func=cmd_schema)
    _add_views_parser(sub, store)
    add_audit_parsers(sub, store)  # audit, explain, export, verify-export (adapters/cli_audit.py)
    add_handoff_parsers(sub, store)  # handoff export, import, status (adapters/cli_handoff.py)
    add_purge_parser(sub, store)  # purge a LangGraph thread's payloads (adapters/cli_purge.py)
    serve = sub.add_parser("serve", parents=[store], help="serve submissions on a bus (NATS or Kafka)")
    serve.add_argument("--bus", required=True, help="nats://HOST:PORT or kafka://HOST:PORT")
    serve.add_argument("--no-relay", action="store_true", help="do not relay committed events to the bus")
    serve.add_argument(
        "--partitions",
        type=_partitions,
        default=(),
        metavar="K,K...",
        help="NATS: answer only these run partitions (the server maps baton.runs.*.submit onto them; "
        "see docs/operations.md, Scaling out)",
    )
    serve.set_defaults(func=cmd_serve)
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _add_views_parser(sub: Any, store: argparse.ArgumentParser) -> None:
    views = sub.add_parser("views", help="materialised views for analysts (docs/analytics.md)")
    views_cmd = views.add_subparsers(dest="action", required=True)
    catch_up = views_cmd.add_parser("catch-up", parents=[store], help="fold new events into the views")
    catch_up.add_argument("--batch-size", type=_positive, default=DEFAULT_BATCH, help="events per transaction")
    catch_up.add_argument("--follow", action="store_true", help="keep polling for new events until Ctrl-C")
    catch_up.add_argument("--interval", type=float, default=1.0, help="seconds between polls with --follow")
    catch_up.set_defaults(func=cmd_views_catch_up)
    rebuild = views_cmd.add_parser("rebuild", parents=[store], help="rebuild the views under new names, then swap")
    rebuild.add_argument("--batch-size", type=_positive, default=DEFAULT_BATCH, help="events per transaction")
    rebuild.set_defaults(func=cmd_views_rebuild)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except tuple(EXIT_CODES) as exc:
        code = next(code for kind, code in EXIT_CODES.items() if isinstance(exc, kind))
        print(f"baton: {_explain(exc)}", file=sys.stderr)
        return code
    except BrokenPipeError:
        return 0


def _explain(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, PersistenceError) and ("does not exist" in str(exc) or "no such table" in str(exc)):
        return f"the store is not initialised ({text}); run: baton store init --store URL"
    return text


if __name__ == "__main__":
    sys.exit(main())
