"""One durable agent step (intent, a trivial tool, observation), Baton against its peers on one PostgreSQL.

    python bench/step.py [--steps N] [--rounds R] [--json FILE]

One embedded PostgreSQL (fsync on) serves every contender, each in its own database:

- **baton**: ``baton.Worker`` over ``LedgerTransport`` on a PostgreSQL ledger: ``intend``, the tool,
  ``observe`` (two fenced, committed appends per step: the intent is durable before the tool runs).
- **langgraph**: a one-node ``StateGraph`` looping N supersteps, each calling the tool, checkpointed by
  LangGraph's ``PostgresSaver`` with ``durability="sync"`` (the checkpoint commits before the next step).
- **dbos**: a DBOS workflow calling the tool as a ``@DBOS.step`` N times (each step's output is
  recorded in DBOS's system database before the next one).

Each timed run is a fresh process running one contender alone (after 50 warm-up steps), so no
contender's background threads (DBOS polls its system database) run while another is timed.
Rounds alternate the order of the contenders so a burst of load on the shared machine hits each.
Reported: the median over rounds of the time per step and of the contender process's CPU per step
(the client's share: the server is another process), and each peer's time over Baton's (above 1
means Baton is faster). The goals (issue 27): LangGraph / Baton >= 2, DBOS / Baton >= 4.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import machine_info
from tests.support.local_servers import LocalPostgres

GOALS = {"langgraph": 2.0, "dbos": 4.0}


def tool(i: int) -> dict[str, int]:
    """The trivial tool every contender calls once per step."""
    return {"i": i, "square": i * i}


def baton_contender(url: str, closers: list[Callable[[], None]]) -> Callable[[int], float]:
    import baton

    baton.init_store(url)
    ledger = baton.open_ledger(url)
    closers.append(ledger.close)
    worker = baton.Worker(baton.Placement("bench", tool_contracts=("tool@1",)), baton.LedgerTransport(ledger), ledger)

    def run(steps: int) -> float:
        run_id = f"step-{uuid.uuid4().hex[:8]}"
        worker.open_run(run_id, "rel-1", ("bench", 1), {"goal": "steps"})
        worker.acquire(run_id)
        start = time.perf_counter()
        for i in range(steps):
            context = baton.IntentContext(i, "tool", effect="read", arguments={"i": i})
            worker.intend(run_id, f"op-{i}", "tool@1", context)
            worker.observe(run_id, f"op-{i}", context, result=tool(i))
        return (time.perf_counter() - start) / steps

    return run


class _Loop(TypedDict):
    i: int
    last: dict[str, int]


def langgraph_contender(url: str, closers: list[Callable[[], None]]) -> Callable[[int], float]:
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import END, START, StateGraph
    from psycopg import Connection
    from psycopg.rows import dict_row

    connection = Connection.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    saver = PostgresSaver(connection)  # type: ignore[arg-type]
    saver.setup()
    closers.append(connection.close)

    def call_tool(state: _Loop) -> dict[str, Any]:
        return {"i": state["i"] + 1, "last": tool(state["i"])}

    def run(steps: int) -> float:
        graph = StateGraph(_Loop)
        graph.add_node("tool", call_tool)
        graph.add_edge(START, "tool")
        graph.add_conditional_edges("tool", lambda s: END if s["i"] >= steps else "tool")
        app = graph.compile(checkpointer=saver)
        config: Any = {"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": steps + 10}
        start = time.perf_counter()
        final = app.invoke({"i": 0, "last": {}}, config, durability="sync")
        elapsed = time.perf_counter() - start
        assert final["i"] == steps, final
        return elapsed / steps

    return run


def dbos_contender(url: str, closers: list[Callable[[], None]]) -> Callable[[int], float]:
    from dbos import DBOS, DBOSConfig

    DBOS(config=DBOSConfig(name="bench-step", system_database_url=url, run_admin_server=False))

    @DBOS.step()
    def dbos_tool(i: int) -> dict[str, int]:
        return tool(i)

    @DBOS.workflow()
    def loop(steps: int) -> int:
        for i in range(steps):
            dbos_tool(i)
        return steps

    DBOS.launch()
    closers.append(DBOS.destroy)  # before the server stops: DBOS keeps a listening connection

    def run(steps: int) -> float:
        start = time.perf_counter()
        assert loop(steps) == steps
        return (time.perf_counter() - start) / steps

    return run


CONTENDERS: dict[str, Callable[[str, list[Callable[[], None]]], Callable[[int], float]]] = {
    "baton": baton_contender,
    "langgraph": langgraph_contender,
    "dbos": dbos_contender,
}


def timed_alone(name: str, url: str, steps: int) -> dict[str, float]:
    """In a child process: warm ``name`` up, then time ``steps`` steps of it (wall and CPU per step)."""
    closers: list[Callable[[], None]] = []
    run = CONTENDERS[name](url, closers)
    run(50)  # warm: connections, prepared statements, imports
    started = time.process_time()  # every thread of this process; the server is another
    seconds = run(steps)
    cpu = (time.process_time() - started) / steps
    for close in closers:
        close()
    return {"seconds": seconds, "cpu": cpu}


def in_child(name: str, url: str, steps: int) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", name, "--url", url, "--steps", str(steps)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--steps", type=int, default=500, help="steps per run")
    parser.add_argument("--rounds", type=int, default=5, help="timed runs per contender")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--child", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(timed_alone(args.child, args.url, args.steps)))
        return 0
    info = machine_info()
    with LocalPostgres() as server:
        urls = {name: server.create_database(f"bench_step_{name}") for name in CONTENDERS}
        times: dict[str, list[float]] = {name: [] for name in CONTENDERS}
        cpu: dict[str, list[float]] = {name: [] for name in CONTENDERS}
        names = list(CONTENDERS)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                result = in_child(name, urls[name], args.steps)
                times[name].append(result["seconds"])
                cpu[name].append(result["cpu"])
                print(f"round {r} {name}: {times[name][-1] * 1e3:.3f} ms/step", file=sys.stderr)
    info["loadavg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    medians = {name: statistics.median(samples) for name, samples in times.items()}
    cpus = {name: statistics.median(samples) * 1e3 for name, samples in cpu.items()}
    print("| | " + " | ".join(f"{k}: {v}" for k, v in info.items()) + " |\n")
    print(f"{args.steps} steps per run, {args.rounds} rounds, median ms per step\n")
    print("| contender | ms/step | client CPU ms/step | peer / Baton | goal | met |")
    print("|---|---|---|---|---|---|")
    summary: dict[str, dict[str, float | bool | None]] = {"baton": {"ms": medians["baton"] * 1e3}}
    print(f"| baton | {medians['baton'] * 1e3:.3f} | {cpus['baton']:.3f} | - | - | - |")
    for name, goal in GOALS.items():
        ratio = medians[name] / medians["baton"]
        summary[name] = {"ms": medians[name] * 1e3, "ratio": ratio, "goal": goal, "met": ratio >= goal}
        met = "yes" if ratio >= goal else "NO"
        print(f"| {name} | {medians[name] * 1e3:.3f} | {cpus[name]:.3f} | {ratio:.2f}x | >= {goal:.0f}x | {met} |")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "times": times, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
