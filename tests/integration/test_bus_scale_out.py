"""Two ``baton serve`` processes, eight worker processes, one NATS and one PostgreSQL.

Per run, worker A opens it, takes epoch 1 on a short lease and keeps appending; worker B waits for
the lease to expire, takes epoch 2 and appends. Requests are spread over both services by the
queue group. Afterwards the store is checked against every verdict the workers received.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
from collections.abc import Iterator
from typing import Any

import nats
import pytest
from bus_support import eventually, stream_events, worker_process
from integration_support import reports_of
from serve_support import Serve

from baton.adapters.bootstrap import open_ledger
from baton.domain.events import RecordedEvent

pytestmark = pytest.mark.timeout(240)

RUNS = 4  # two workers each: eight worker processes


@pytest.fixture
def two_services(bus_store_url: str, nats_url: str) -> Iterator[list[Serve]]:
    services: list[Serve] = []
    try:
        for _ in range(2):
            services.append(Serve(nats_url, bus_store_url))
        for service in services:
            service.wait_ready()
        yield services
    finally:
        for service in services:
            service.stop()


def test_two_services_share_eight_workers_without_losing_doubling_or_letting_a_stale_epoch_through(
    two_services: list[Serve], bus_store_url: str, nats_url: str
) -> None:
    """Given two services and eight workers moving leases, then each acknowledged event is stored once and fenced."""
    ctx = multiprocessing.get_context("spawn")
    results: Any = ctx.Queue()
    run_ids = [f"scale-{n}" for n in range(RUNS)]
    workers = [
        ctx.Process(target=worker_process, args=(nats_url, run_id, role, 5_000 if role == "A" else 60, results))
        for run_id in run_ids
        for role in ("A", "B")
    ]
    outcomes = reports_of(workers, results, 180)
    assert [error for *_, error in outcomes if error] == []
    with contextlib.closing(open_ledger(bus_store_url)) as ledger:
        expected = {run_id: list(ledger.history(run_id)) for run_id in run_ids}
        try:
            asyncio.run(_assert_relayed_exactly_once(nats_url, expected))  # while both relays run
        except AssertionError as exc:
            tails = ["".join(line for line in service.output if "relay" in line)[-3000:] for service in two_services]
            raise AssertionError(f"{exc}\n--- service logs ---\n" + "\n---\n".join(tails)) from None
        answered = [service.stop() for service in two_services]
        assert all(count > 0 for count in answered), f"the queue group did not share the load: {answered}"
        for run_id, events in expected.items():
            log = [pair for _, run, pairs, _ in outcomes if run == run_id for pair in pairs]
            accepted = {v["submission_id"]: v["position"] for _, v in log if v["verdict"] == "accepted"}
            stale = [v for s, v in log if s["worker"] == "A" and v["reason"] == "stale_epoch"]
            by_position = {e.position: e for e in events}
            # no lost acknowledged event: each accepted verdict names a stored event of that submission
            assert all(by_position[pos].submission_id == sid for sid, pos in accepted.items())
            # no duplicate, no gap: positions are 1..n and every stored submission was acknowledged
            assert [e.position for e in events] == list(range(1, len(events) + 1))
            assert {e.submission_id for e in events} == set(accepted)
            # no stale-epoch event after the lease moved to epoch 2
            moved = next(e.position for e in events if e.type == "LeaseGranted" and e.epoch == 2)
            assert all(e.worker == "B" and e.epoch == 2 for e in events[moved:])
            assert stale, f"A never learnt that the lease of {run_id} moved"
            assert ledger.verify(run_id).events == len(events)


async def _assert_relayed_exactly_once(nats_url: str, expected: dict[str, list[RecordedEvent]]) -> None:
    """Two relays, one events stream: every event exactly once, in each run's order."""
    nc = await nats.connect(nats_url)
    try:

        async def complete() -> bool:
            return len(await stream_events(nc)) >= sum(len(v) for v in expected.values())

        try:
            await eventually(complete, what="the relays to publish every event")
        except AssertionError:
            streamed = await stream_events(nc)
            positions = {run_id: [e.position for _, e in streamed if e.run_id == run_id] for run_id in expected}
            raise AssertionError(f"stream has {len(streamed)} events: {positions}") from None
        for run_id, events in expected.items():
            assert [e for _, e in await stream_events(nc, run_id)] == events
        assert len(await stream_events(nc)) == sum(len(v) for v in expected.values())
    finally:
        await nc.close()
