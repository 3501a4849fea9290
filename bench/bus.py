"""End-to-end submission throughput and latency over the bus, next to its two limits.

    python bench/bus.py                 # about 2 min here
    python bench/bus.py --quick         # about 50 s
    python bench/bus.py --json out.json

Every cell runs W concurrent workers (asyncio tasks in this process, each driving its own run with
sequential request-reply: send, wait for the verdict, send the next) for a fixed time:

* ``bus``: worker -> NATS -> ``baton serve`` (a separate process: ``NatsBus`` with group commit,
  relay on) -> ledger -> PostgreSQL (fsync on) -> verdict;
* ``bus, no group commit``: the same service appending one submission per transaction;
* ``bus, 2 services, partitioned``: two such services, each answering one of two run partitions
  (a second nats-server maps ``baton.runs.*.submit`` onto ``baton.p.<k>.runs.*.submit``), so a
  run's requests always reach the same service; only one of them relays;
* ``nats echo``: a nats-py responder in a separate process that returns the request (the transport
  limit: no decode, no store);
* ``direct append``: ``ledger.submit`` in W threads of this process (the store limit: no bus).

Each cell also reports CPU per verdict (process CPU time over the cell, warm-up included, divided
by every verdict of the cell): of the service processes (``serve``: the echo responder for ``nats
echo``) and of this process (``client``; the appending threads for ``direct append``). Every
process shares the same cores, so a cheaper client or service is more verdicts per second.

All cells use one fresh embedded PostgreSQL and one nats-server (two for the partitioned cells);
servers are removed at the end. Before the cells the server writes and checkpoints 512 MiB of WAL
(``LocalPostgres.warm_wal``), so its commits reuse recycled WAL segments as a long-running server's
do: a fresh cluster creates each 16 MiB segment by writing it full of zeros, which held every
commit in flight for 40-50 ms once every 4-5 s of the 32-worker cells.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/bus.py` puts bench/ first, not the project root
    sys.path.insert(0, str(ROOT))

import nats
import psycopg
from nats.aio.msg import Msg

from baton.adapters.bootstrap import init_store, open_ledger
from baton.adapters.bus.nats_app import partition_mapping
from baton.adapters.eventstore import RunLedger
from baton.adapters.wire import decode_verdict, encode_submission
from baton.domain.commands import AcquireLease, Command, OpenRun, RecordIntent, RecordObservation, Submission
from baton.domain.events import BlobRef, IntentContext, Placement
from baton.domain.operations import context_digest
from bench.machine import machine_info
from bench.processes import process_cpu, ready_process
from tests.support.local_servers import LocalNats, LocalPostgres

TASK = BlobRef("sha256:" + "ab" * 32, 11, "blob://task")
WORKERS = (1, 8, 32)
GROUP_COMMIT = "bus (group commit)"
NO_GROUP_COMMIT = "bus, no group commit"
PARTITIONED = "bus, 2 services, partitioned"
_NEXT: dict[str, int] = {}  # next op number per run, across cells: every submission is new


def next_op(run_id: str) -> int:
    _NEXT[run_id] = _NEXT.get(run_id, 0) + 1
    return _NEXT[run_id]


@dataclass
class Cell:
    scenario: str
    workers: int
    verdicts: int
    seconds: float
    rejected: int
    p50_ms: float
    p99_ms: float
    total: int = 0  # verdicts including the warm-up: what the CPU columns divide by
    p90_ms: float = float("nan")  # in the JSON only: with p99 and max, whether the tail is broad or a few stalls
    max_ms: float = float("nan")
    serve_cpu_ms: float = float("nan")  # CPU per verdict of the service process(es)
    client_cpu_ms: float = float("nan")  # CPU per verdict of this process

    @property
    def rate(self) -> float:
        return self.verdicts / self.seconds


def intent(run_id: str, worker: str, n: int) -> Submission:
    """The ``n``-th submission of a run's step stream: odd ``n`` an intent, even ``n`` its observation
    (an intent must be settled before the next one, so a stream of intents alone is rejected)."""
    op = f"{worker}-{(n + 1) // 2}"
    context = IntentContext(turn=1, operation=op, arguments={"n": (n + 1) // 2})
    if n % 2:
        command: Command = RecordIntent(op, "pure", "tool@1", context, f"idem-{op}")
    else:
        command = RecordObservation(op, context_digest(context), "ok", result={"n": n})
    return Submission(f"{run_id}-{n}", run_id, worker, command, 1)


def prepare_runs(ledger: RunLedger, prefix: str, count: int) -> list[tuple[str, str]]:
    """``count`` runs, each opened with its worker holding epoch 1 for an hour."""
    runs = []
    for i in range(count):
        run_id, worker = f"{prefix}-{i}", f"w{i}"
        ledger.submit(Submission(f"open-{run_id}", run_id, "sup", OpenRun("rel", "agent", 1, TASK)))
        verdict = ledger.submit(Submission(f"acq-{run_id}", run_id, worker, AcquireLease(Placement(worker), 3_600_000)))
        assert verdict.verdict == "accepted", verdict
        runs.append((run_id, worker))
    return runs


def summarise(name: str, workers: int, latencies: list[float], seconds: float, rejected: int, total: int) -> Cell:
    ordered = sorted(latencies)

    def quantile(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1e3 if ordered else float("nan")

    p50 = statistics.median(ordered) * 1e3 if ordered else float("nan")
    return Cell(name, workers, len(ordered), seconds, rejected, p50, quantile(0.99), total, quantile(0.9), quantile(1))


async def drive(
    workers: int, seconds: float, call: Callable[[int, int], Awaitable[bool]]
) -> tuple[list[float], int, int]:
    """Run ``workers`` sequential loops for ``seconds`` after a short warm-up: latencies of the
    measured part, rejections among them, and every call made (the warm-up too)."""
    latencies: list[float] = []
    rejected = 0
    total = 0
    start = time.perf_counter()
    warm_until, stop_at = start + 0.5, start + 0.5 + seconds

    async def loop(w: int) -> None:
        nonlocal rejected, total
        n = 0
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at:
                return
            ok = await call(w, n)
            n += 1
            total += 1
            if t0 >= warm_until:
                latencies.append(time.perf_counter() - t0)
                rejected += not ok

    await asyncio.gather(*(loop(w) for w in range(workers)))
    return latencies, rejected, total


async def bus_cell(nats_url: str, runs: list[tuple[str, str]], workers: int, seconds: float, name: str) -> Cell:
    nc = await nats.connect(nats_url)

    async def call(w: int, n: int) -> bool:
        run_id, worker = runs[w]
        raw = encode_submission(intent(run_id, worker, next_op(run_id)))
        reply = await nc.request(f"baton.runs.{run_id}.submit", raw, timeout=30)
        return decode_verdict(reply.data).verdict == "accepted"

    try:
        latencies, rejected, total = await drive(workers, seconds, call)
    finally:
        await nc.close()
    return summarise(name, workers, latencies, seconds, rejected, total)


async def echo_cell(nats_url: str, workers: int, seconds: float) -> Cell:
    nc = await nats.connect(nats_url)
    raw = encode_submission(intent("echo", "w", 0))

    async def call(w: int, n: int) -> bool:
        reply = await nc.request("bench.echo", raw, timeout=30)
        return len(reply.data) == len(raw)

    try:
        latencies, rejected, total = await drive(workers, seconds, call)
    finally:
        await nc.close()
    return summarise("nats echo", workers, latencies, seconds, rejected, total)


def direct_cell(store_url: str, runs: list[tuple[str, str]], workers: int, seconds: float) -> Cell:
    ledger = open_ledger(store_url)
    latencies: list[float] = []
    rejected = [0]
    total = [0]
    lock = threading.Lock()
    start = time.perf_counter()
    warm_until, stop_at = start + 0.5, start + 0.5 + seconds

    def loop(w: int) -> None:
        run_id, worker = runs[w]
        mine: list[float] = []
        bad = calls = 0
        while (t0 := time.perf_counter()) < stop_at:
            ok = ledger.submit(intent(run_id, worker, next_op(run_id))).verdict == "accepted"
            calls += 1
            if t0 >= warm_until:
                mine.append(time.perf_counter() - t0)
                bad += not ok
        with lock:
            latencies.extend(mine)
            rejected[0] += bad
            total[0] += calls

    threads = [threading.Thread(target=loop, args=(w,)) for w in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ledger.close()
    return summarise("direct append", workers, latencies, seconds, rejected[0], total[0])


# -- helper processes ----------------------------------------------------------------------------


def serve_main(nats_url: str, store_url: str, group_commit: bool, partitions: tuple[int, ...] = ()) -> None:
    from baton.adapters.bus import NatsBus, NatsOptions

    # with partitions, only the service of partition 0 relays (one relay per events stream is enough)
    options = NatsOptions(
        group_commit=group_commit, queue=f"bench-{group_commit}", partitions=partitions, relay=0 in (partitions or (0,))
    )

    async def main() -> None:
        ledger = open_ledger(store_url)
        async with NatsBus(ledger, nats_url, options):
            print("ready", flush=True)
            await asyncio.Event().wait()

    asyncio.run(main())


def echo_main(nats_url: str) -> None:
    async def main() -> None:
        nc = await nats.connect(nats_url)

        async def echo(msg: Msg) -> None:
            await msg.respond(msg.data)

        await nc.subscribe("bench.echo", queue="echo", cb=echo)
        await nc.flush()  # the server has the subscription: a request right after "ready" finds it
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def helper(*args: str) -> contextlib.AbstractContextManager[int]:
    """A helper process of this script (``--serve`` or ``--echo``), ready; yields its pid."""
    return ready_process([sys.executable, __file__, *args])


# -- the run -------------------------------------------------------------------------------------


def cpu_busy(before: tuple[int, int], after: tuple[int, int]) -> float:
    idle, total = after[0] - before[0], after[1] - before[1]
    return 1 - idle / total if total else float("nan")


def cpu_ticks() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return fields[3] + fields[4], sum(fields)


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(
    cells: list[Cell], busy: dict[str, float], name: str, cell: Callable[[int], Cell], servers: tuple[int, ...] = ()
) -> None:
    """One scenario at every worker count, with the machine's CPU share during each cell and the CPU
    per verdict of the ``servers`` (pids) and of this process."""
    for workers in WORKERS:
        before, client = cpu_ticks(), own_cpu()
        served = sum(process_cpu(pid) for pid in servers)
        result = cell(workers)
        busy[f"{name} x{workers}"] = cpu_busy(before, cpu_ticks())
        if result.total:
            result.client_cpu_ms = (own_cpu() - client) / result.total * 1e3
            if servers:
                result.serve_cpu_ms = (sum(process_cpu(pid) for pid in servers) - served) / result.total * 1e3
        cells.append(result)


def over_bus(url: str, runs: list[tuple[str, str]], seconds: float, name: str) -> Callable[[int], Cell]:
    return lambda workers: asyncio.run(bus_cell(url, runs, workers, seconds, name))


WARM_WAL_MB = 512  # the full run writes about 300 MiB of WAL (``wal_written_mb`` in the output)


def wal_position(url: str) -> int:
    """The server's current WAL position, in bytes."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    return int(row[0]) if row else 0


def run_all(seconds: float, info: dict[str, str]) -> tuple[list[Cell], dict[str, float]]:
    cells: list[Cell] = []
    busy: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="baton-bench-"), LocalPostgres() as pg, LocalNats() as ns:
        store = pg.create_database(f"bench_bus_{uuid.uuid4().hex[:8]}")
        init_store(store)
        setup = open_ledger(store)
        runs = {name: prepare_runs(setup, name, max(WORKERS)) for name in ("gc", "single", "direct", "parts")}
        setup.close()
        # A long-running server's commits reuse recycled WAL segments; a fresh one's create them (see warm_wal)
        info["wal_segments_ready"] = str(pg.warm_wal(WARM_WAL_MB))
        start = wal_position(store)
        for group_commit, name, key in ((True, GROUP_COMMIT, "gc"), (False, NO_GROUP_COMMIT, "single")):
            with helper("--serve", ns.url, store, "1" if group_commit else "0", "-") as pid:
                measure(cells, busy, name, over_bus(ns.url, runs[key], seconds, name), (pid,))
        # two services, each owning one of two run partitions: its own nats-server, with the mapping
        with (
            LocalNats(mappings=partition_mapping(2)) as mapped,
            helper("--serve", mapped.url, store, "1", "0") as first,
            helper("--serve", mapped.url, store, "1", "1") as second,
        ):
            measure(
                cells, busy, PARTITIONED, over_bus(mapped.url, runs["parts"], seconds, PARTITIONED), (first, second)
            )
        with helper("--echo", ns.url) as echo:
            measure(cells, busy, "nats echo", lambda w: asyncio.run(echo_cell(ns.url, w, seconds)), (echo,))
        measure(cells, busy, "direct append", lambda w: direct_cell(store, runs["direct"], w, seconds))
        info["wal_written_mb"] = f"{(wal_position(store) - start) / 2**20:.0f}"
    return cells, busy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 s per cell instead of 5")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--serve", nargs=4, metavar=("NATS", "STORE", "GC", "PARTITIONS"), help=argparse.SUPPRESS)
    parser.add_argument("--echo", metavar="NATS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        partitions = tuple(int(k) for k in args.serve[3].split(",") if k != "-")
        serve_main(args.serve[0], args.serve[1], args.serve[2] == "1", partitions)
        return 0
    if args.echo:
        echo_main(args.echo)
        return 0

    seconds = 2.0 if args.quick else 5.0
    info = machine_info()
    cells, busy = run_all(seconds, info)
    info["loadavg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())

    print(f"# bus benchmark ({'quick' if args.quick else 'full'}: {seconds:.0f} s per cell)\n")
    for key, value in info.items():
        print(f"* {key}: {value}")
    print(
        "\n| scenario | workers | verdicts/s | p50 ms | p99 ms | rejected | machine CPU busy "
        "| serve CPU ms/verdict | client CPU ms/verdict |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for cell in cells:
        share = busy[f"{cell.scenario} x{cell.workers}"]
        serve = "-" if cell.serve_cpu_ms != cell.serve_cpu_ms else f"{cell.serve_cpu_ms:.3f}"  # nan: no service
        print(
            f"| {cell.scenario} | {cell.workers} | {cell.rate:,.0f} | {cell.p50_ms:.2f} | {cell.p99_ms:.2f} "
            f"| {cell.rejected} | {share:.0%} | {serve} | {cell.client_cpu_ms:.3f} |"
        )
    rate = {(c.scenario, c.workers): c.rate for c in cells}
    gains = [f"x{w}: {rate[GROUP_COMMIT, w] / rate[NO_GROUP_COMMIT, w]:.2f}x" for w in WORKERS]
    print("\ngroup commit gain: " + ", ".join(gains))
    scale = [f"x{w}: {rate[PARTITIONED, w] / rate[GROUP_COMMIT, w]:.2f}x" for w in WORKERS]
    print("two partitioned services against one: " + ", ".join(scale))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "cells": [asdict(c) for c in cells]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
