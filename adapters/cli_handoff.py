"""``baton handoff export|import|status`` and ``baton gate``: the handoff protocol from a shell.

``export`` prepares the handoff in the source store (the lease moves there) and writes the document
to stdout with its digest on stderr; ``import`` accepts it in the destination store (importing the
run when that store has never seen it). Both are idempotent: after a lost reply, run the same
command again, or ask ``status``: the store is the only source of truth.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from baton.adapters import handoff
from baton.adapters.bootstrap import open_ledger
from baton.adapters.cli_args import add_placement_arguments, placement_from
from baton.domain.commands import Verdict

__all__ = ["add_handoff_parsers"]

_json = msgspec.json.Encoder()


def cmd_export(args: argparse.Namespace) -> int:
    state: dict[str, Any] = json.loads(Path(args.state).read_text(encoding="utf-8"))
    destination = placement_from(args, args.to)
    ledger = open_ledger(args.store, one_shot=True)
    try:
        prepared = handoff.prepare(
            ledger, args.run_id, destination=destination, state=state, to_version=args.to_version, ttl_ms=args.ttl_ms
        )
    finally:
        ledger.close()
    if prepared.verdict.verdict == "rejected":
        return _refused(prepared.verdict)
    sys.stdout.buffer.write(prepared.document)
    sys.stdout.flush()
    print(prepared.digest, file=sys.stderr)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    data = Path(args.document).read_bytes()
    ledger = open_ledger(args.store, one_shot=True)
    try:
        verdict = handoff.accept(ledger, data, args.expect_digest, ttl_ms=args.ttl_ms)
    finally:
        ledger.close()
    print(_json.encode(verdict).decode())
    return 1 if verdict.verdict == "rejected" else 0


def cmd_status(args: argparse.Namespace) -> int:
    ledger = open_ledger(args.store, one_shot=True)
    try:
        found = handoff.status(ledger, args.run_id)
    finally:
        ledger.close()
    print(_json.encode(found).decode())
    return 0 if found.exists else 1


def cmd_gate(args: argparse.Namespace) -> int:
    ledger = open_ledger(args.store, one_shot=True)
    try:
        decision = handoff.gate(ledger, args.run_id, args.worker, args.epoch, args.op)
    finally:
        ledger.close()
    if args.json:
        print(_json.encode(decision).decode())
    else:
        print(f"{'allowed' if decision.allowed else 'denied'} ({decision.reason}): {decision.detail}")
    return 0 if decision.allowed else 1


def _refused(verdict: Verdict) -> int:
    print(f"handoff refused ({verdict.reason}): {verdict.message}", file=sys.stderr)
    return 1


def add_handoff_parsers(sub: Any, store: argparse.ArgumentParser) -> None:
    """Register ``baton handoff`` and its actions."""
    actions = sub.add_parser("handoff", help="hand a run to another worker, store or region").add_subparsers(
        dest="action", required=True
    )
    export = actions.add_parser("export", parents=[store], help="prepare a handoff; the document goes to stdout")
    export.add_argument("run_id", metavar="RUN_ID")
    export.add_argument("--to", required=True, metavar="WORKER", help="the destination worker")
    export.add_argument("--state", required=True, metavar="FILE", help="the task state the last checkpoint sealed")
    export.add_argument("--to-version", type=int, default=None, help="migrate the state to this schema version")
    add_placement_arguments(export)
    export.add_argument("--ttl-ms", type=int, default=30_000, help="the destination's first lease")
    export.set_defaults(func=cmd_export)
    imported = actions.add_parser("import", parents=[store], help="accept a handoff document (imports the run)")
    imported.add_argument("document", metavar="DOCUMENT")
    imported.add_argument("--expect-digest", required=True, metavar="DIGEST", help="from a trusted channel")
    imported.add_argument("--ttl-ms", type=int, default=30_000)
    imported.set_defaults(func=cmd_import)
    status = actions.add_parser("status", parents=[store], help="what the store says about a run's handoffs")
    status.add_argument("run_id", metavar="RUN_ID")
    status.set_defaults(func=cmd_status)
    gate = sub.add_parser("gate", parents=[store], help="may worker W at epoch E perform operation O now?")
    gate.add_argument("run_id", metavar="RUN_ID")
    gate.add_argument("--worker", required=True)
    gate.add_argument("--epoch", required=True, type=int)
    gate.add_argument("--op", required=True, metavar="OP_ID")
    gate.add_argument("--json", action="store_true")
    gate.set_defaults(func=cmd_gate)
