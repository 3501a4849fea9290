"""``baton``: a thin command line over the ledger.

Each command decodes its input, calls the ledger and prints; errors map to exit codes in one table.
Without ``--store`` (and without ``BATON_STORE``) every command uses the embedded default, the
SQLite file ``baton.db`` in the current directory.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

import msgspec
from eventsourcing.persistence import PersistenceError
from pydantic import ValidationError

from adapters.bootstrap import init_store, open_ledger
from adapters.demo import run_demo
from adapters.eventstore import RunLedger
from domain.canonical import short
from domain.commands import Submission, Verdict
from domain.errors import BatonError, ChainBroken, StoreUnavailable
from domain.events import RecordedEvent

__all__ = ["EXIT_CODES", "main"]

# One table from error to exit code; anything else is a bug and exits 70 (EX_SOFTWARE).
EXIT_CODES: dict[type[BaseException], int] = {
    ChainBroken: 4,
    StoreUnavailable: 3,
    BatonError: 1,
    ValidationError: 2,
    PersistenceError: 3,
}

_submission = msgspec.json.Decoder(Submission)
_json = msgspec.json.Encoder()


def _ledger(args: argparse.Namespace) -> RunLedger:
    return open_ledger(args.store)


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
    try:
        submission = _submission.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return _malformed(line, str(exc))
    return ledger.submit(submission)


def _malformed(line: bytes, message: str) -> Verdict:
    try:
        partial = msgspec.json.decode(line)
    except msgspec.DecodeError:
        partial = None
    fields = partial if isinstance(partial, dict) else {}
    sid, run = fields.get("submission_id"), fields.get("run_id")
    return Verdict(
        sid if isinstance(sid, str) else None,
        "rejected",
        run if isinstance(run, str) else None,
        reason="malformed",
        message=message,
    )


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


def cmd_schema(args: argparse.Namespace) -> int:
    target = {"submission": Submission, "verdict": Verdict, "event": RecordedEvent}[args.what]
    print(_json.encode(msgspec.json.schema(target)).decode())
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
    schema = sub.add_parser("schema", help="print the JSON Schema of the wire format")
    schema.add_argument("what", nargs="?", default="submission", choices=["submission", "verdict", "event"])
    schema.set_defaults(func=cmd_schema)
    return parser


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
