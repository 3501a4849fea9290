"""One durable agent step (intent, a trivial tool, observation), Baton against its peers on one PostgreSQL.

    python bench/step.py [--steps N] [--rounds R] [--json FILE]
    python bench/recovery.py      # the same step killed -9 mid-run, then recovered (issue 29; its own docstring)

One embedded PostgreSQL (fsync on) serves every contender, each in its own database:

- **baton**: ``baton.Worker`` over ``LedgerTransport`` on a PostgreSQL ledger: ``intend``, the tool,
  ``observe`` (two fenced, committed appends per step: the intent is durable before the tool runs).
- **langgraph**: a one-node ``StateGraph`` looping N supersteps, each calling the tool, checkpointed by
  LangGraph's ``PostgresSaver`` with ``durability="sync"`` (the checkpoint commits before the next step).
- **baton-signed**: the same on a store that verifies identities: the worker is a registered
  principal and signs every submission; the ledger verifies each signature and fences the registry.
- **dbos**: a DBOS workflow calling the tool as a ``@DBOS.step`` N times (each step's output is
  recorded in DBOS's system database before the next one).

Each timed run is a fresh process running one contender alone (after 50 warm-up steps), so no
contender's background threads (DBOS polls its system database) run while another is timed.
Rounds alternate the order of the contenders so a burst of load on the shared machine hits each.
Reported: the median over rounds of the time per step and of the contender process's CPU per step
(the client's share: the server is another process), and each peer's time over Baton's (above 1
means Baton is faster), and the cost of signing and of verifying one submission. The goals (issues 27
and 28): LangGraph / Baton >= 2, DBOS / Baton >= 4, LangGraph / signed Baton >= 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import machine_info
from tests.support.local_servers import LocalPostgres

GOALS = {"langgraph": 2.0, "dbos": 4.0}
OPERATOR_KEY = "BENCH_STEP_OPERATOR_KEY"  # the signed store's operator key file, for the child processes


def tool(i: int) -> dict[str, int]:
    """The trivial tool every contender calls once per step."""
    return {"i": i, "square": i * i}


def baton_contender(url: str, closers: list[Callable[[], None]], *, signed: bool = False) -> Callable[[int], float]:
    import baton

    key, name = None, "bench"
    if signed:  # a store that verifies identities: the worker is a registered principal and signs
        from baton.adapters.bootstrap import register
        from baton.domain.commands import AddPrincipal

        operator = baton.SigningKey.read(os.environ[OPERATOR_KEY])  # the parent opened the registry with it
        key, name = baton.SigningKey.generate(), f"bench-{uuid.uuid4().hex[:8]}"
        assert register(url, operator, AddPrincipal(name, ("worker",), key.public_key)).verdict == "accepted"
    else:
        baton.init_store(url)
    ledger = baton.open_ledger(url)
    closers.append(ledger.close)
    placement = baton.Placement(name, tool_contracts=("tool@1",))
    worker = baton.Worker(placement, baton.LedgerTransport(ledger), ledger, key=key)

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


def signed_contender(url: str, closers: list[Callable[[], None]]) -> Callable[[int], float]:
    return baton_contender(url, closers, signed=True)


CONTENDERS: dict[str, Callable[[str, list[Callable[[], None]]], Callable[[int], float]]] = {
    "baton": baton_contender,
    "baton-signed": signed_contender,
    "langgraph": langgraph_contender,
    "dbos": dbos_contender,
}


def signature_costs(n: int = 2000) -> tuple[float, float]:
    """Seconds to sign one submission and to verify it (digest included), the median of five runs of ``n``."""
    import baton
    from baton.adapters.identity import verify_signature
    from baton.domain.commands import RecordIntent

    key = baton.SigningKey.generate()
    context = baton.IntentContext(1, "tool", effect="read", arguments={"i": 1})
    submission = baton.Submission("s-1", "run-1", "bench", RecordIntent("op-1", "pure", "tool@1", context, "k"), 1)
    signed = key.sign(submission)
    sign_runs, verify_runs = [], []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(n):
            key.sign(submission)
        sign_runs.append((time.perf_counter() - started) / n)
        started = time.perf_counter()
        for _ in range(n):
            verify_signature(key.public_key, signed)
        verify_runs.append((time.perf_counter() - started) / n)
    return statistics.median(sign_runs), statistics.median(verify_runs)


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
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{name} failed:\n{done.stderr}")
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
    with LocalPostgres() as server, tempfile.TemporaryDirectory() as keys:
        urls = {name: server.create_database(f"bench_step_{name.replace('-', '_')}") for name in CONTENDERS}
        import baton

        operator = baton.SigningKey.generate()
        os.environ[OPERATOR_KEY] = str(operator.write(Path(keys) / "operator.key"))
        baton.init_store(urls["baton-signed"], operator_key=operator)
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
    print("| peer / contender | peer ms/step | contender ms/step | contender client CPU ms/step | ratio | goal | met |")
    print("|---|---|---|---|---|---|---|")
    summary: dict[str, dict[str, float | bool]] = {}
    for baton_name in ("baton", "baton-signed"):
        for peer, goal in GOALS.items():
            ratio = medians[peer] / medians[baton_name]
            summary[f"{peer}/{baton_name}"] = {"ratio": ratio, "goal": goal, "met": ratio >= goal}
            print(
                f"| {peer} / {baton_name} | {medians[peer] * 1e3:.3f} | {medians[baton_name] * 1e3:.3f} "
                f"| {cpus[baton_name]:.3f} | {ratio:.2f}x | >= {goal:.0f}x | {'yes' if ratio >= goal else 'NO'} |"
            )
    signing, verifying = signature_costs()
    print(f"\nper submission, in this process: signing {signing * 1e6:.1f} us, verifying {verifying * 1e6:.1f} us")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "times": times, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
