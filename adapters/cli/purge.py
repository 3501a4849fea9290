"""``baton purge``: erase a LangGraph thread's payloads with an audit record (docs/langgraph.md)."""

from __future__ import annotations

import contextlib

import click

from baton.adapters.bootstrap import open_ledger
from baton.adapters.cli.options import echo_json, json_option, store_option
from baton.adapters.eventstore.blobs import SqlConnection
from baton.adapters.langgraph.purge import purge_thread
from baton.adapters.settings import StoreSettings

__all__ = ["COMMANDS"]


@click.command("purge")
@click.argument("run_id", metavar="RUN_ID")
@click.option("--reason", required=True, help="why the data must be erased (recorded in the log)")
@click.option("--operator", help="who purges (default: operator:$USER)")
@json_option
@store_option
def purge(run_id: str, reason: str, operator: str | None, as_json: bool, store: str | None) -> int:
    """Erase a LangGraph thread's payloads (audited)."""
    with (
        contextlib.closing(open_ledger(store, one_shot=True)) as ledger,
        contextlib.closing(SqlConnection(StoreSettings.resolve(store).url, pool_size=1)) as conn,
    ):
        report = purge_thread(ledger, conn, run_id, reason=reason, operator=operator)
    if as_json:
        echo_json(report)
    else:
        click.echo(
            f"purged {report.run_id}: {report.erased} blobs erased ({report.deleted} deleted now, "
            f"{report.kept_shared} shared with other threads kept), audit record at position {report.position}, "
            f"{report.blobs_digest}"
        )
    return 0


COMMANDS = (purge,)
