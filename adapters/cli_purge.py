"""``baton purge``: erase a LangGraph thread's payloads with an audit record (docs/langgraph.md)."""

from __future__ import annotations

import argparse
from typing import Any

import msgspec

from baton.adapters.bootstrap import open_ledger
from baton.adapters.eventstore.blobs import SqlConnection
from baton.adapters.langgraph.purge import purge_thread
from baton.adapters.settings import StoreSettings

__all__ = ["add_purge_parser"]


def cmd_purge(args: argparse.Namespace) -> int:
    ledger = open_ledger(args.store, one_shot=True)
    conn = SqlConnection(StoreSettings.resolve(args.store).url, pool_size=1)
    try:
        report = purge_thread(ledger, conn, args.run_id, reason=args.reason, operator=args.operator)
    finally:
        conn.close()
        ledger.close()
    if args.json:
        print(msgspec.json.encode(report).decode())
    else:
        print(
            f"purged {report.run_id}: {report.erased} blobs erased ({report.deleted} deleted now, "
            f"{report.kept_shared} shared with other threads kept), audit record at position {report.position}, "
            f"{report.blobs_digest}"
        )
    return 0


def add_purge_parser(sub: Any, store: argparse.ArgumentParser) -> None:
    purge = sub.add_parser("purge", parents=[store], help="erase a LangGraph thread's payloads (audited)")
    purge.add_argument("run_id", metavar="RUN_ID")
    purge.add_argument("--reason", required=True, help="why the data must be erased (recorded in the log)")
    purge.add_argument("--operator", help="who purges (default: operator:$USER)")
    purge.add_argument("--json", action="store_true")
    purge.set_defaults(func=cmd_purge)
