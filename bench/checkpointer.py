"""LangGraph checkpointer benchmark: ``BatonSaver`` against LangGraph's ``AsyncPostgresSaver``.

    python bench/checkpointer.py [--checkpoints N] [--rounds R] [--gets G] [--json FILE]

One embedded PostgreSQL (``tests.support.local_servers.LocalPostgres``, fsync on) serves both savers,
each in its own database. Per round and per saver, on a fresh thread: N sequential ``aput`` of a
checkpoint chained to its parent (channels: a counter and a small dict written every step, a
256-byte constant written once), then G ``aget_tuple`` of the latest checkpoint, then 3 full
``alist`` of the thread. Rounds alternate the savers (Baton, Postgres, Postgres, Baton, ...) so a
burst of load from other users of the machine hits both. Reported: median per-operation times over
the rounds and the ratio Baton / PostgresSaver (below 1 means Baton is faster), and the client CPU
per put (``time.process_time``, every thread of this process; the server's CPU is not in it). Both
use the async API with one commit (fsync) per put: AsyncPostgresSaver pipelines its upserts on one
autocommit connection (and serializes blobs in a worker thread); BatonSaver awaits the ledger's one
fenced statement on an asyncio connection (``RunLedger.asubmit``), and runs reads in a thread.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from baton.adapters import bootstrap
from baton.adapters.langgraph import BatonSaver
from bench.machine import machine_info
from bench.savers import baton_against_postgres
from tests.support.local_servers import LocalPostgres

CONSTANT = "x" * 256


async def workload(saver: BaseCheckpointSaver[Any], thread: str, n: int, gets: int) -> dict[str, float]:
    """Put n chained checkpoints, then get the latest ``gets`` times, then list the thread 3 times."""
    config: dict[str, Any] = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    versions: dict[str, Any] = {}
    start, cpu = time.perf_counter(), time.process_time()
    for step in range(n):
        checkpoint = empty_checkpoint()
        updated = {"counter": step, "state": {"step": step, "ok": True}}
        if step == 0:
            updated["constant"] = CONSTANT
        new_versions = {}
        for channel in updated:
            versions[channel] = saver.get_next_version(versions.get(channel), None)
            new_versions[channel] = versions[channel]
        checkpoint["channel_values"] = {"constant": CONSTANT, "counter": step, "state": updated["state"]}
        checkpoint["channel_versions"] = dict(versions)
        metadata: Any = {"source": "loop", "step": step, "parents": {}}
        config = await saver.aput(config, checkpoint, metadata, new_versions)
    put, put_cpu = (time.perf_counter() - start) / n, (time.process_time() - cpu) / n
    latest = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    samples = []
    for _ in range(gets):
        t0 = time.perf_counter()
        found = await saver.aget_tuple(latest)
        samples.append(time.perf_counter() - t0)
        assert found is not None and found.checkpoint["channel_values"]["counter"] == n - 1
    lists = []
    for _ in range(3):
        t0 = time.perf_counter()
        count = len([t async for t in saver.alist(latest)])
        lists.append(time.perf_counter() - t0)
        assert count == n, count
    return {"put": put, "put_cpu": put_cpu, "get": statistics.median(samples), "list": statistics.median(lists)}


async def run(url_baton: str, url_pg: str, n: int, rounds: int, gets: int) -> dict[str, list[dict[str, float]]]:
    results: dict[str, list[dict[str, float]]] = {"baton": [], "postgres": []}
    baton = BatonSaver.from_url(url_baton, worker="bench")
    async with AsyncPostgresSaver.from_conn_string(url_pg) as pg:
        await pg.setup()
        savers: dict[str, Callable[[str], Awaitable[dict[str, float]]]] = {
            "baton": lambda t: workload(baton, t, n, gets),
            "postgres": lambda t: workload(pg, t, n, gets),
        }
        await savers["baton"]("warm-baton")  # connections, caches, prepared statements
        await savers["postgres"]("warm-pg")
        for r in range(rounds):
            order = ["baton", "postgres"] if r % 2 == 0 else ["postgres", "baton"]
            for name in order:
                results[name].append(await savers[name](f"t-{r}-{name}"))
                print(f"round {r} {name}: {results[name][-1]} load {os.getloadavg()[0]:.2f}", file=sys.stderr)
    baton.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--checkpoints", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--gets", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    info = machine_info()
    with LocalPostgres() as server:
        url_baton = server.create_database("bench_lg_baton")
        url_pg = server.create_database("bench_lg_pg")
        bootstrap.init_store(url_baton)
        results = asyncio.run(run(url_baton, url_pg, args.checkpoints, args.rounds, args.gets))
    info["loadavg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print("| | " + " | ".join(f"{k}: {v}" for k, v in info.items()) + " |\n")
    print(f"{args.checkpoints} checkpoints per thread, {args.rounds} rounds, medians over rounds\n")
    print("| operation | BatonSaver | AsyncPostgresSaver | ratio Baton / Postgres |")
    print("|---|---|---|---|")
    rows = [
        ("put", "ms/checkpoint"),
        ("put_cpu", "ms client CPU/checkpoint"),
        ("get", "ms (latest)"),
        ("list", "ms (full)"),
    ]
    summary = baton_against_postgres(results, rows)
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "results": results, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
