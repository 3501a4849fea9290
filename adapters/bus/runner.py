"""Run the bus service until SIGINT/SIGTERM: the body of ``baton serve``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from urllib.parse import urlsplit

from baton.adapters.bus.kafka_app import KafkaBus, KafkaOptions
from baton.adapters.bus.nats_app import NatsBus, NatsOptions
from baton.adapters.bus.service import Ledger

__all__ = ["build_bus", "serve"]

log = logging.getLogger("baton.bus")


def build_bus(
    ledger: Ledger,
    bus_url: str,
    *,
    relay: bool = True,
    group_commit: bool = True,
    partitions: tuple[int, ...] = (),
) -> NatsBus | KafkaBus:
    """``nats://host:port`` or ``kafka://host:port[,host:port...]`` -> the service for that bus."""
    scheme = urlsplit(bus_url).scheme
    if scheme in {"nats", "tls"}:
        return NatsBus(ledger, bus_url, NatsOptions(relay=relay, group_commit=group_commit, partitions=partitions))
    if partitions:
        raise ValueError("--partitions is for NATS; Kafka's own partitions already keep a run on one service")
    if scheme == "kafka":
        return KafkaBus(ledger, bus_url.split("://", 1)[1], KafkaOptions(relay=relay))
    raise ValueError(f"unsupported bus URL {bus_url!r}: use nats://HOST:PORT or kafka://HOST:PORT")


async def serve(
    ledger: Ledger,
    bus_url: str,
    *,
    relay: bool = True,
    partitions: tuple[int, ...] = (),
    ready: asyncio.Event | None = None,
) -> None:
    """Serve until SIGINT or SIGTERM, then stop cleanly (in-flight batches finish first)."""
    bus = build_bus(ledger, bus_url, relay=relay, partitions=partitions)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread, or not POSIX
            loop.add_signal_handler(sig, stop.set)
    async with bus:
        log.info("baton serve: listening on %s", bus_url)
        print(f"baton serve: ready on {bus_url}", flush=True)
        if ready is not None:
            ready.set()
        await stop.wait()
    print(f"baton serve: stopped after answering {bus.service.handled} messages", flush=True)
