"""``baton serve`` as an orchestrator meets it (issue 31): it checks the store before saying "ready",
fails fast with one line when the bus is not there, and stops within 5 s of SIGTERM or SIGINT at
any moment, answering what it already took. The real CLI in a subprocess, on a real NATS."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from bus_support import open_run, request
from serve_support import finished, serve, wait_for_line

from baton.adapters.bootstrap import init_store, open_ledger

STOP_WITHIN_S = 5.0
STORE_CHECK_WITHIN_S = 5.0 + 3.0  # the bound, and an interpreter start that imports the brokers
BUS_FAILS_WITHIN_S = 15.0 + 3.0


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts TCP connections and never says a word (a wedged broker)."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield int(listener.getsockname()[1])
    listener.close()
    for conn in held:
        conn.close()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/serve.db"
    init_store(url, unsigned=True)
    return url


def test_an_uninitialised_store_is_refused_before_ready(tmp_path: Path, nats_url: str) -> None:
    """Given a store never initialised, when serve starts, then it exits 3 naming store init and
    never says ready."""
    code, stdout, stderr, took = finished(serve(tmp_path, "--bus", nats_url, "--store", "sqlite:///fresh.db"), 8)

    assert code == 3
    assert took < STORE_CHECK_WITHIN_S
    assert "ready" not in stdout
    assert "baton store init" in stderr


def test_a_refused_bus_fails_at_once_in_one_line(tmp_path: Path, sqlite_store: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    code, stdout, stderr, took = finished(
        serve(tmp_path, "--bus", f"nats://127.0.0.1:{port}", "--store", sqlite_store), 8
    )

    assert code == 3
    assert took < BUS_FAILS_WITHIN_S
    assert stdout == ""
    assert stderr == (
        f"baton: cannot reach the bus nats://127.0.0.1:{port}: 127.0.0.1:{port} refused the connection "
        "(is the broker running there?)\n"
    )


def test_a_bus_that_never_answers_fails_within_fifteen_seconds(
    tmp_path: Path, sqlite_store: str, silent_port: int
) -> None:
    code, stdout, stderr, took = finished(
        serve(tmp_path, "--bus", f"nats://127.0.0.1:{silent_port}", "--store", sqlite_store), 18
    )

    assert code == 3
    assert took < BUS_FAILS_WITHIN_S
    assert "ready" not in stdout
    assert stderr.count("\n") == 1
    assert stderr.startswith(f"baton: cannot reach the bus nats://127.0.0.1:{silent_port}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_connecting_stops_it_within_five_seconds(
    tmp_path: Path, sqlite_store: str, silent_port: int, sig: signal.Signals
) -> None:
    """Given serve stuck connecting to a bus that never answers, when it gets the signal, then it
    stops within 5 s without a traceback."""
    process = serve(tmp_path, "--bus", f"nats://127.0.0.1:{silent_port}", "--store", sqlite_store)
    wait_for_line(process, "connecting to")  # its handlers are installed: a fixed sleep raced a loaded host
    process.send_signal(sig)

    code, stdout, stderr, took = finished(process, STOP_WITHIN_S)

    assert took < STOP_WITHIN_S
    assert code == 0, stderr
    assert "Traceback" not in stderr
    assert "stopped before the bus was ready" in stdout


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_serving_stops_it_within_five_seconds_answering_what_it_took(
    tmp_path: Path, sqlite_store: str, nats_url: str, sig: signal.Signals
) -> None:
    """Given serve ready on a real NATS with a submission answered, when it gets the signal, then it
    exits 0 within 5 s, says how many it answered, and the run is in the store."""
    process = serve(tmp_path, "--bus", nats_url, "--store", sqlite_store, "--no-relay")
    wait_for_line(process, "ready on")

    async def submit() -> str:
        client = await nats.connect(nats_url)
        try:
            return (await request(client, open_run("served-1"))).verdict
        finally:
            await client.close()

    status = asyncio.run(submit())
    process.send_signal(sig)
    code, stdout, stderr, took = finished(process, STOP_WITHIN_S)

    assert status == "accepted"
    assert took < STOP_WITHIN_S
    assert code == 0, stderr
    assert "stopped after answering 1 messages" in stdout
    ledger = open_ledger(sqlite_store, one_shot=True)
    try:
        assert "served-1" in {run.run_id for run in ledger.runs()}
    finally:
        ledger.close()
