"""One durable agent step (intent, a trivial tool, observation), Baton against its peers on one PostgreSQL.

    python bench/step.py [--steps N] [--rounds R] [--json FILE] [--bus nats]
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
- **baton-nats** (with ``--bus nats``): the baton step over the bus, as in production: a
  nats-server and ``baton serve --bus nats://...`` (its own process, on the same PostgreSQL);
  the worker submits over ``NatsTransport`` (core-NATS request-reply) and reads from the store.

Each timed run is a fresh process running one contender alone (after 50 warm-up steps), so no
contender's background threads (DBOS polls its system database) run while another is timed.
Rounds alternate the order of the contenders so a burst of load on the shared machine hits each.
Reported: the median over rounds of the time per step and of the contender process's CPU per step
(the client's share: the server is another process), and each peer's time over Baton's (above 1
means Baton is faster), and the cost of signing and of verifying one submission. The goals (issues 27
and 28): LangGraph / Baton >= 2, DBOS / Baton >= 4, LangGraph / signed Baton >= 2; with ``--bus nats``
(issue 33): LangGraph / baton-nats >= 1, and the service's CPU per step beside the client's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import machine_info
from bench.processes import process_cpu, ready_process
from tests.support.local_servers import LocalNats, LocalPostgres

GOALS = {"langgraph": 2.0, "dbos": 4.0}
BUS_GOALS = {"langgraph": 1.0}  # baton-nats: at most as slow as LangGraph in-process
OPERATOR_KEY = "BENCH_STEP_OPERATOR_KEY"  # the signed store's operator key file, for the child processes
NATS_URL = "BENCH_STEP_NATS_URL"  # the nats-server ``baton serve`` listens on, for the child processes
SERVE_PID = "BENCH_STEP_SERVE_PID"  # ``baton serve``'s process, whose CPU a bus contender reads
ROOT = Path(__file__).resolve().parents[1]


def tool(i: int) -> dict[str, int]:
    """The trivial tool every contender calls once per step."""
    return {"i": i, "square": i * i}


def baton_contender(
    url: str, closers: list[Callable[[], None]], *, signed: bool = False, bus: bool = False
) -> Callable[[int], float]:
    import baton

    key, name = None, "bench"
    if signed:  # a store that verifies identities: the worker is a registered principal and signs
        from baton.adapters.bootstrap import register
        from baton.domain.commands import AddPrincipal

        operator = baton.SigningKey.read(os.environ[OPERATOR_KEY])  # the parent opened the registry with it
        key, name = baton.SigningKey.generate(), f"bench-{uuid.uuid4().hex[:8]}"
        assert register(url, operator, AddPrincipal(name, ("worker",), key.public_key)).verdict == "accepted"
    elif not bus:  # over the bus, the parent made the store that ``baton serve`` serves
        baton.init_store(url)
    ledger = baton.open_ledger(url)
    closers.append(ledger.close)
    placement = baton.Placement(name, tool_contracts=("tool@1",))
    transport: baton.Transport = baton.LedgerTransport(ledger)
    if bus:  # submissions over NATS to ``baton serve``; reads (the epoch after acquire) from the store
        transport = nats = baton.NatsTransport(os.environ[NATS_URL])
        closers.insert(0, nats.close)
    worker = baton.Worker(placement, transport, ledger, key=key)
    closers.insert(0, worker.close)  # its lease renewals first, then the transport and the reader

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


def nats_contender(url: str, closers: list[Callable[[], None]]) -> Callable[[int], float]:
    return baton_contender(url, closers, bus=True)


CONTENDERS: dict[str, Callable[[str, list[Callable[[], None]]], Callable[[int], float]]] = {
    "baton": baton_contender,
    "baton-signed": signed_contender,
    "langgraph": langgraph_contender,
    "dbos": dbos_contender,
    "baton-nats": nats_contender,
}
BUS_CONTENDERS = ("baton-nats",)  # only with ``--bus nats``


@contextlib.contextmanager
def baton_serve(store_url: str) -> Iterator[int]:
    """A nats-server and ``baton serve --bus nats://...`` on ``store_url`` (its own process); yields its pid."""
    with LocalNats() as nats_server:
        command = [sys.executable, "-m", "baton.adapters.cli", "serve", "--bus", nats_server.url, "--store", store_url]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        with ready_process(command, env=env) as pid:
            os.environ[NATS_URL], os.environ[SERVE_PID] = nats_server.url, str(pid)
            yield pid


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
    serve_pid = int(os.environ[SERVE_PID]) if name in BUS_CONTENDERS else 0
    served = process_cpu(serve_pid) if serve_pid else 0.0
    started = time.process_time()  # every thread of this process; the server is another
    seconds = run(steps)
    cpu = (time.process_time() - started) / steps
    result = {"seconds": seconds, "cpu": cpu}
    if serve_pid:  # the service's share (its event relay included), over the same steps
        result["serve_cpu"] = (process_cpu(serve_pid) - served) / steps
    for close in closers:
        close()
    return result


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
    parser.add_argument("--bus", choices=("nats",), help="also time the step over the bus (baton serve)")
    parser.add_argument("--child", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(timed_alone(args.child, args.url, args.steps)))
        return 0
    info = machine_info()
    names = [name for name in CONTENDERS if args.bus or name not in BUS_CONTENDERS]
    with LocalPostgres() as server, tempfile.TemporaryDirectory() as keys, contextlib.ExitStack() as bus:
        urls = {name: server.create_database(f"bench_step_{name.replace('-', '_')}") for name in names}
        import baton

        operator = baton.SigningKey.generate()
        os.environ[OPERATOR_KEY] = str(operator.write(Path(keys) / "operator.key"))
        baton.init_store(urls["baton-signed"], operator_key=operator)
        if args.bus:
            baton.init_store(urls["baton-nats"])
            bus.enter_context(baton_serve(urls["baton-nats"]))
        times: dict[str, list[float]] = {name: [] for name in names}
        cpu: dict[str, list[float]] = {name: [] for name in names}
        serve_cpu: list[float] = []
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                result = in_child(name, urls[name], args.steps)
                times[name].append(result["seconds"])
                cpu[name].append(result["cpu"])
                if "serve_cpu" in result:
                    serve_cpu.append(result["serve_cpu"])
                print(f"round {r} {name}: {times[name][-1] * 1e3:.3f} ms/step", file=sys.stderr)
    info["loadavg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    medians = {name: statistics.median(samples) for name, samples in times.items()}
    cpus = {name: statistics.median(samples) * 1e3 for name, samples in cpu.items()}
    print("| | " + " | ".join(f"{k}: {v}" for k, v in info.items()) + " |\n")
    print(f"{args.steps} steps per run, {args.rounds} rounds, median ms per step\n")
    print("| peer / contender | peer ms/step | contender ms/step | contender client CPU ms/step | ratio | goal | met |")
    print("|---|---|---|---|---|---|---|")
    summary: dict[str, dict[str, float | bool]] = {}
    pairs = [(baton_name, GOALS) for baton_name in ("baton", "baton-signed")]
    pairs += [(baton_name, BUS_GOALS) for baton_name in BUS_CONTENDERS if baton_name in names]
    for baton_name, goals in pairs:
        for peer, goal in goals.items():
            ratio = medians[peer] / medians[baton_name]
            summary[f"{peer}/{baton_name}"] = {"ratio": ratio, "goal": goal, "met": ratio >= goal}
            print(
                f"| {peer} / {baton_name} | {medians[peer] * 1e3:.3f} | {medians[baton_name] * 1e3:.3f} "
                f"| {cpus[baton_name]:.3f} | {ratio:.2f}x | >= {goal:.0f}x | {'yes' if ratio >= goal else 'NO'} |"
            )
    if serve_cpu:
        print(f"\nbaton serve CPU per step (its event relay included): {statistics.median(serve_cpu) * 1e3:.3f} ms")
    signing, verifying = signature_costs()
    print(f"\nper submission, in this process: signing {signing * 1e6:.1f} us, verifying {verifying * 1e6:.1f} us")
    if args.json:
        written = {"machine": info, "times": times, "cpu": cpu, "serve_cpu": serve_cpu, "summary": summary}
        args.json.write_text(json.dumps(written, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
