"""LangGraph supersteps: a real graph checkpointed by ``BatonSaver`` against LangGraph's ``PostgresSaver``.

    python bench/supersteps.py [--steps N] [--rounds R] [--profile FILE] [--json FILE]

One embedded PostgreSQL (``tests.support.local_servers.LocalPostgres``, fsync on) serves both savers,
each in its own database. The graph is one node that adds 1 to a counter, looping N supersteps,
run with the sync API (``graph.invoke``) and ``durability="sync"``: each superstep's writes and its
checkpoint commit before the next superstep starts, so the time per superstep is the saver's
latency plus LangGraph's own work, the same for both. Per round and per saver, a new thread_id runs
the graph; rounds alternate the savers (Baton, Postgres, Postgres, Baton, ...) so a burst of load
from other users of the machine hits both. Reported: the median over rounds of the wall time and of
the client CPU (``time.process_time``: every thread of this process, not the server's) per
superstep, and the ratio Baton / PostgresSaver (below 1 means Baton is faster). With ``--profile``,
one more Baton run is profiled (cProfile, every thread) and its top functions by cumulative time
are written to the file.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from psycopg import Connection
from psycopg.rows import dict_row

from baton.adapters import bootstrap
from baton.adapters.langgraph import BatonSaver
from bench.machine import machine_info
from bench.savers import baton_against_postgres
from tests.support.local_servers import LocalPostgres


class Counter(TypedDict):
    n: int


def supersteps(saver: BaseCheckpointSaver[Any], steps: int) -> dict[str, float]:
    """Run the counter graph for ``steps`` supersteps on a fresh thread: wall and client CPU seconds per superstep."""
    graph = StateGraph(Counter)
    graph.add_node("step", lambda state: {"n": state["n"] + 1})
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", lambda state: "step" if state["n"] < steps else END)
    app = graph.compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": steps + 10}
    start, cpu = time.perf_counter(), time.process_time()
    final = app.invoke({"n": 0}, config, durability="sync")
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert final == {"n": steps}, final
    return {"wall": wall / steps, "cpu": cpu / steps}


def measure(url_baton: str, url_pg: str, steps: int, rounds: int) -> dict[str, list[dict[str, float]]]:
    """Alternating rounds of ``supersteps`` on each saver, after one warm-up run each."""
    results: dict[str, list[dict[str, float]]] = {"baton": [], "postgres": []}
    with (
        BatonSaver.from_url(url_baton, worker="bench") as baton,
        Connection.connect(url_pg, autocommit=True, prepare_threshold=0, row_factory=dict_row) as connection,
    ):
        pg = PostgresSaver(connection)  # type: ignore[arg-type]
        pg.setup()
        savers: dict[str, BaseCheckpointSaver[Any]] = {"baton": baton, "postgres": pg}
        for saver in savers.values():
            supersteps(saver, 50)  # connections, prepared statements, imports
        for r in range(rounds):
            for name in ["baton", "postgres"] if r % 2 == 0 else ["postgres", "baton"]:
                results[name].append(supersteps(savers[name], steps))
                ms = results[name][-1]["wall"] * 1e3
                print(f"round {r} {name}: {ms:.3f} ms/superstep, load {os.getloadavg()[0]:.2f}", file=sys.stderr)
    return results


def profile(url_baton: str, steps: int, top: int = 40) -> str:
    """cProfile of one Baton run in every thread, by cumulative time: LangGraph calls the saver from
    its thread pool (made anew per ``invoke``), so each new thread starts a profiler of its own."""
    profilers: list[cProfile.Profile] = []

    def per_thread(*_: object) -> None:  # the first profile event of a new thread
        sys.setprofile(None)
        profilers.append(cProfile.Profile())
        profilers[-1].enable()

    with BatonSaver.from_url(url_baton, worker="bench-profile") as baton:
        supersteps(baton, 50)
        profilers.append(cProfile.Profile())
        threading.setprofile(per_thread)
        try:
            profilers[0].runcall(supersteps, baton, steps)
        finally:
            threading.setprofile(None)
    out = io.StringIO()
    pstats.Stats(*profilers, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--steps", type=int, default=1000, help="supersteps per run")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--profile", type=Path, help="also profile one Baton run; the report goes here")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    info = machine_info()
    with LocalPostgres() as server:
        url_baton = server.create_database("bench_supersteps_baton")
        url_pg = server.create_database("bench_supersteps_pg")
        bootstrap.init_store(url_baton)
        results = measure(url_baton, url_pg, args.steps, args.rounds)
        if args.profile:
            args.profile.write_text(profile(url_baton, args.steps))
    info["loadavg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print("| | " + " | ".join(f"{k}: {v}" for k, v in info.items()) + " |\n")
    print(f'{args.steps} supersteps per run, durability="sync", {args.rounds} rounds, medians over rounds\n')
    print("| measure | BatonSaver | PostgresSaver | ratio Baton / Postgres |")
    print("|---|---|---|---|")
    summary = baton_against_postgres(results, [("wall", "ms/superstep"), ("cpu", "ms client CPU/superstep")])
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "results": results, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
