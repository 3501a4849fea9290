"""``baton serve``: answer submissions on NATS or Kafka until SIGINT/SIGTERM (docs/operations.md)."""

from __future__ import annotations

import asyncio
import contextlib

import click

from baton.adapters.bootstrap import open_ledger
from baton.adapters.cli.app import Failed
from baton.adapters.cli.options import store_option
from baton.adapters.observability.logs import LogFormat, configure_logging

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
@click.option(
    "--share-partitions",
    type=click.IntRange(1, 1024),
    metavar="N",
    help="NATS: share the N run partitions with every service started alike, each holding an even share "
    "leased in the KV bucket baton_partitions; a dead service's share moves to the others",
)
@click.option(
    "--replicas",
    type=click.IntRange(1, 5),
    default=1,
    show_default=True,
    help="NATS: JetStream replicas of the streams and the bucket when this service creates them (3 in a cluster)",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    metavar="PORT",
    help="serve Prometheus metrics on http://HOST:PORT/metrics (0: a free port, printed when ready)",
)
@click.option(
    "--metrics-host", default="127.0.0.1", show_default=True, metavar="HOST", help="the address --metrics-port binds"
)
@click.option(
    "--log-format",
    type=click.Choice(["auto", "json", "console"]),
    default="auto",
    show_default=True,
    help="log lines on stderr: JSON, or console lines (coloured on a terminal); auto: console on a terminal",
)
@store_option
def serve(
    bus: str,
    no_relay: bool,
    partitions: tuple[int, ...],
    share_partitions: int | None,
    replicas: int,
    metrics_port: int | None,
    metrics_host: str,
    log_format: LogFormat,
    store: str | None,
) -> int:
    """Serve submissions on a bus (NATS or Kafka)."""
    from baton.adapters.bus import serve as serve_bus  # noqa: PLC0415 (faststream and the brokers are slow to import)

    configure_logging(fmt=log_format)
    with contextlib.closing(open_ledger(store)) as ledger:
        try:
            served = serve_bus(
                ledger,
                bus,
                relay=not no_relay,
                partitions=partitions,
                shared_partitions=share_partitions or 0,
                replicas=replicas,
                metrics_port=metrics_port,
                metrics_host=metrics_host,
            )
            asyncio.run(served)
        except ValueError as exc:  # the bus URL, or partitions on Kafka
            raise Failed(str(exc)) from None
    return 0


COMMANDS = (serve,)
