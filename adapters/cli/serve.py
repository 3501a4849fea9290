"""``baton serve``: answer submissions on NATS or Kafka until SIGINT/SIGTERM (docs/operations.md)."""

from __future__ import annotations

import asyncio
import contextlib

import click

from baton.adapters.bootstrap import open_ledger
from baton.adapters.cli.app import Failed
from baton.adapters.cli.options import store_option

__all__ = ["COMMANDS"]


def _partitions(ctx: click.Context, param: click.Parameter, text: str | None) -> tuple[int, ...]:
    """``0,1,5`` -> (0, 1, 5): the run partitions one ``baton serve`` answers."""
    if text is None:
        return ()
    try:
        parts = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        parts = ()
    if not parts or parts[0] < 0:
        raise click.BadParameter(f"expected partition numbers such as 0,1 (not {text!r})", ctx, param)
    return parts


@click.command("serve")
@click.option("--bus", required=True, metavar="URL", help="nats://HOST:PORT or kafka://HOST:PORT")
@click.option("--no-relay", is_flag=True, help="do not relay committed events to the bus")
@click.option(
    "--partitions",
    callback=_partitions,
    metavar="K,K...",
    help="NATS: answer only these run partitions (the server maps baton.runs.*.submit onto them; "
    "see docs/operations.md, Scaling out)",
)
@store_option
def serve(bus: str, no_relay: bool, partitions: tuple[int, ...], store: str | None) -> int:
    """Serve submissions on a bus (NATS or Kafka)."""
    from baton.adapters.bus import serve as serve_bus  # noqa: PLC0415 (faststream and the brokers are slow to import)

    with contextlib.closing(open_ledger(store)) as ledger:
        try:
            asyncio.run(serve_bus(ledger, bus, relay=not no_relay, partitions=partitions))
        except ValueError as exc:  # the bus URL, or partitions on Kafka
            raise Failed(str(exc)) from None
    return 0


COMMANDS = (serve,)
