"""Run the bus service until SIGINT/SIGTERM: the body of ``baton serve``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from asyncio import FIRST_COMPLETED
from urllib.parse import urlsplit

from baton.adapters.bus.kafka_app import KafkaBus, KafkaOptions
from baton.adapters.bus.nats_app import NatsBus, NatsOptions
from baton.adapters.bus.service import Ledger
from baton.adapters.bus_urls import addresses
from baton.adapters.observability import MetricsServer, ServiceMetrics, Telemetry
from baton.domain.errors import BusUnavailable

__all__ = ["CONNECT_WITHIN_S", "STOP_WITHIN_S", "build_bus", "reachable", "serve"]

log = logging.getLogger("baton.bus")

CONNECT_WITHIN_S = 10  # a bus that accepts TCP but never becomes ready (the issue allows 15 s in all)
PROBE_WITHIN_S = 3  # one TCP connect per bus address, before the client's own (slow) connect
STOP_WITHIN_S = 4  # SIGTERM to exit: within the 5 s an orchestrator's grace period commonly starts from


def build_bus(
    ledger: Ledger,
    bus_url: str,
    *,
    relay: bool = True,
    group_commit: bool = True,
    partitions: tuple[int, ...] = (),
    shared_partitions: int = 0,
    replicas: int = 1,
    metrics: ServiceMetrics | None = None,
) -> NatsBus | KafkaBus:
    """``nats://host:port[,host:port...]`` or ``kafka://host:port[,host:port...]`` -> the service for that bus."""
    scheme = urlsplit(bus_url).scheme
    if partitions and shared_partitions:
        raise ValueError("--partitions names a fixed share; --share-partitions leases one: choose one")
    if scheme in {"nats", "tls"}:
        options = NatsOptions(
            relay=relay,
            group_commit=group_commit,
            partitions=partitions,
            shared_partitions=shared_partitions,
            replicas=replicas,
        )
        return NatsBus(ledger, bus_url, options, telemetry=Telemetry(metrics=metrics, system="nats"))
    if partitions or shared_partitions:
        raise ValueError("--partitions is for NATS; Kafka's own partitions already keep a run on one service")
    if scheme == "kafka":
        telemetry = Telemetry(metrics=metrics, system="kafka")
        return KafkaBus(ledger, bus_url.split("://", 1)[1], KafkaOptions(relay=relay), telemetry=telemetry)
    raise ValueError(f"unsupported bus URL {bus_url!r}: use nats://HOST:PORT or kafka://HOST:PORT")


async def serve(
    ledger: Ledger,
    bus_url: str,
    *,
    relay: bool = True,
    partitions: tuple[int, ...] = (),
    shared_partitions: int = 0,
    replicas: int = 1,
    ready: asyncio.Event | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
) -> None:
    """Serve until SIGINT or SIGTERM, then stop within ``STOP_WITHIN_S`` (in-flight batches finish).

    A signal is heard from the first line on, also while the bus is still connecting; a bus that is
    not there fails within ``CONNECT_WITHIN_S`` with ``BusUnavailable`` (the brokers' clients retry
    for minutes, silently, by default). With ``metrics_port``, ``/metrics`` is served there
    (Prometheus) until the service has stopped; port 0 picks a free one, printed with "ready".
    """
    metrics = None if metrics_port is None else ServiceMetrics(takeovers=lambda: ledger.lease_takeovers)
    bus = build_bus(
        ledger,
        bus_url,
        relay=relay,
        partitions=partitions,
        shared_partitions=shared_partitions,
        replicas=replicas,
        metrics=metrics,
    )
    server = None if metrics is None or metrics_port is None else _metrics_server(metrics, metrics_port, metrics_host)
    try:
        served = await _serve(bus, bus_url, ready, server)
    finally:
        if server is not None:
            server.close()
    if served:
        print(f"baton serve: stopped after answering {bus.service.handled} messages", flush=True)


def _metrics_server(metrics: ServiceMetrics, port: int, host: str) -> MetricsServer:
    try:
        return MetricsServer(metrics, port, host)
    except OSError as exc:  # the CLI prints it as one line
        raise ValueError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None


async def _serve(
    bus: NatsBus | KafkaBus, bus_url: str, ready: asyncio.Event | None, server: MetricsServer | None
) -> bool:
    """True once served and stopped; False if told to stop before the bus was ready."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread, or not POSIX
            loop.add_signal_handler(sig, stop.set)
    try:
        if not await _started(bus, bus_url, stop):
            print("baton serve: stopped before the bus was ready", flush=True)
            return False
        log.info("baton serve: listening on %s", bus_url)
        metrics = "" if server is None else f", metrics on http://{server.host}:{server.port}/metrics"
        print(f"baton serve: ready on {bus_url}{metrics}", flush=True)
        if ready is not None:
            ready.set()
        await stop.wait()
    finally:
        await _stopped(bus)
    return True


async def _started(bus: NatsBus | KafkaBus, bus_url: str, stop: asyncio.Event) -> bool:
    """Start ``bus``; False if told to stop first. Every bus address is probed first, so a refused
    port or an unknown host fails at once and names its cause."""
    await reachable(bus_url)
    print(f"baton serve: connecting to {bus_url}", flush=True)  # signals are heard from here on
    starting = asyncio.ensure_future(bus.start())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        done, _ = await asyncio.wait({starting, stopping}, timeout=CONNECT_WITHIN_S, return_when=FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if starting in done:
        try:
            starting.result()
        except Exception as exc:  # the broker's client gave up: its own words, on one line
            raise BusUnavailable(f"cannot start on the bus {bus_url}: {type(exc).__name__}: {exc}") from exc
        return True
    starting.cancel()
    # abandoned: how it ends does not matter, and a client cancelled mid-handshake may not end at all
    # until its connection is closed (the bus's stop, next), so it is not awaited for long
    await asyncio.wait({starting}, timeout=1)
    if starting.done() and not starting.cancelled():
        starting.exception()  # retrieved, so that it is not logged as never retrieved
    if stopping in done:
        return False
    raise BusUnavailable(f"cannot reach the bus {bus_url}: no answer within {CONNECT_WITHIN_S} s")


async def _stopped(bus: NatsBus | KafkaBus) -> None:
    """Stop ``bus``, draining what is in flight, for at most ``STOP_WITHIN_S``: a submission still
    unanswered then is redelivered by the broker to another service (it was never acknowledged)."""
    try:
        await asyncio.wait_for(bus.stop(), STOP_WITHIN_S)
    except TimeoutError:
        log.warning("baton serve: stopped after %s s with work in flight (redelivered by the broker)", STOP_WITHIN_S)
    except Exception:  # a bus that never fully started
        log.debug("baton serve: stopping a bus that did not start", exc_info=True)


async def reachable(bus_url: str) -> None:
    """Open (and close) one TCP connection to some address of ``bus_url``, or raise ``BusUnavailable``
    with the cause for each: a dead address answers at once, before a client's minutes of retries."""
    causes = []
    for host, port in addresses(bus_url):
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), PROBE_WITHIN_S)
        except (OSError, TimeoutError) as exc:
            causes.append(f"{host}:{port} {_cause(exc)}")
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return
    raise BusUnavailable(f"cannot reach the bus {bus_url}: {'; '.join(causes)} (is the broker running there?)")


def _cause(exc: OSError) -> str:
    if isinstance(exc, TimeoutError):
        return f"did not answer within {PROBE_WITHIN_S} s"
    if isinstance(exc, ConnectionRefusedError):
        return "refused the connection"
    if isinstance(exc, socket.gaierror):
        return "is not a known host"
    return exc.strerror or str(exc)
