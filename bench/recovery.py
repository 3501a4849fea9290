"""Crash recovery after kill -9 (issue 29): Baton against LangGraph + PostgresSaver and DBOS on one PostgreSQL.

    python bench/recovery.py [--steps N] [--kill-at K] [--rounds R] [--json FILE]

A worker process runs N steps (1000) of bench/step.py's trivial tool as its framework makes a step
durable; the tool first appends its invocation to a file (the effect happened), then at step K
(500) the process kills itself with SIGKILL, inside the tool. The parent then spawns a new process
that recovers and finishes the run. Measured: the time from that spawn to step N done (interpreter
start and imports included, reported apart as start-up), and the tool's invocations from the file.

- **baton**: the first worker runs ``Worker.step`` on a PostgreSQL ledger (its lease declares a
  liveness session). The new process is another worker: it ``acquire``s the run (retried on
  ``LeaseHeld`` until PostgreSQL sees the killed session gone), resumes, finds the uncertain
  step's idempotency key (``RUN/op-K``) in the invocation file and reconciles it ``applied`` with
  the result found there, resumes again and runs steps 1..N: the settled prefix returns recorded
  results without calling the tool, and the first new step sends ``resume_from``.
- **langgraph**: a one-node ``StateGraph`` looping N supersteps under ``PostgresSaver`` with
  ``durability="sync"``; the new process invokes the graph with ``None`` on the same thread id,
  which resumes from the last checkpoint and so runs step K again.
- **dbos**: a workflow of N ``@DBOS.step`` calls; the new process launches DBOS with the same
  config, which recovers the executor's pending workflow (re-enqueued, picked up by its queue
  thread) and re-runs step K, whose output was never recorded.

Rounds rotate the order of the contenders; reported are the medians. Goal: LangGraph / Baton >= 1
(Baton no slower than LangGraph + PostgresSaver), with exactly N invocations for Baton.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import machine_info
from bench.step import _Loop, tool
from tests.support.local_servers import LocalPostgres

TAKEOVER_TIMEOUT_S = 40.0  # past the lease's 30 s ttl: a takeover that waits this long has failed


class Job:
    """One process's share of a crash-and-recover round, as its command line gives it."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.url: str = args.url
        self.ident: str = args.ident  # the run, thread or workflow id
        self.log = Path(args.log)
        self.steps: int = args.steps
        self.kill_at: int = args.kill_at  # 0 in the recovering process
        self.first: bool = args.phase == "first"

    def invoke(self, i: int) -> dict[str, int]:
        """The tool: append the invocation with its key and result (the effect), then die at ``kill_at``."""
        result = tool(i)
        with self.log.open("a") as log:
            log.write(f"{self.ident}/op-{i}\t{json.dumps(result)}\n")
        if i == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return result


def baton_job(job: Job) -> dict[str, Any]:
    import baton
    from baton.adapters.audit_runner import audit_store
    from baton.domain.events import IntentReconciled

    open_ledger, worker_class, transport = baton.open_ledger, baton.Worker, baton.LedgerTransport  # imported now
    ready = time.monotonic()
    ledger = open_ledger(job.url)
    placement = baton.Placement("first" if job.first else "second", tool_contracts=("tool@1",))
    worker = worker_class(placement, transport(ledger), ledger)
    report: dict[str, Any] = {"ready": ready}
    if job.first:
        worker.open_run(job.ident, "rel-1", ("bench", 1), {"goal": "recovery"})
        worker.acquire(job.ident)
    else:
        report["takeover_waits"] = take_over(worker, job.ident)
        report["class"] = worker.resume(job.ident).resumability.cls
        report["reconciled_ops"] = reconcile(worker, job)
        worker.resume(job.ident)  # a fresh cursor: the prefix now includes the reconciled step
    for i in range(1, job.steps + 1):
        context = baton.IntentContext(i, "tool", effect="read", arguments={"i": i})
        worker.step(job.ident, f"op-{i}", "tool@1", context, functools.partial(job.invoke, i))
    report["done"] = time.monotonic()
    history = list(ledger.history(job.ident))
    report["intent_reconciled"] = sum(isinstance(e.body, IntentReconciled) for e in history)
    report["audit_ok"] = audit_store(ledger, job.ident).ok
    report["chain_events"] = ledger.verify(job.ident).events
    worker.close()
    ledger.close()
    return report


def take_over(worker: Any, run_id: str) -> int:
    """Acquire the killed worker's run; the number of ``LeaseHeld`` refusals before PostgreSQL saw it gone."""
    import baton

    deadline, waits = time.monotonic() + TAKEOVER_TIMEOUT_S, 0
    while True:
        try:
            worker.acquire(run_id)
            return waits
        except baton.errors.LeaseHeld:
            if time.monotonic() > deadline:
                raise
            waits += 1
            time.sleep(0.005)


def reconcile(worker: Any, job: Job) -> list[str]:
    """Settle each uncertain op by its idempotency key in the invocation file: applied if found, else not."""
    lines = job.log.read_text().splitlines()
    settled = []
    for op in worker.reader.state(job.ident).operations.values():
        found = [(n, line) for n, line in enumerate(lines, 1) if line.split("\t")[0] == op.idempotency_key]
        if found:
            n, line = found[0]
            result = json.loads(line.split("\t")[1])
            worker.applied(job.ident, op.op_id, evidence=f"invocation log line {n}", result=result)
        else:
            worker.not_applied(job.ident, op.op_id, evidence="no invocation log line")
        settled.append(op.op_id)
    return settled


def langgraph_job(job: Job) -> dict[str, Any]:
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import END, START, StateGraph
    from psycopg import Connection
    from psycopg.rows import dict_row

    ready = time.monotonic()
    connection = Connection.connect(job.url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    saver = PostgresSaver(connection)
    if job.first:
        saver.setup()

    def call_tool(state: _Loop) -> dict[str, Any]:
        i = state["i"] + 1
        return {"i": i, "last": job.invoke(i)}

    graph = StateGraph(_Loop)
    graph.add_node("tool", call_tool)
    graph.add_edge(START, "tool")
    graph.add_conditional_edges("tool", lambda s: END if s["i"] >= job.steps else "tool")
    app = graph.compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": job.ident}, "recursion_limit": job.steps + 10}
    # the recovering process passes no input: the graph goes on from the thread's last checkpoint
    final = app.invoke({"i": 0, "last": {}} if job.first else None, config, durability="sync")
    done = time.monotonic()
    assert final["i"] == job.steps, final
    connection.close()
    return {"ready": ready, "done": done}


def dbos_job(job: Job) -> dict[str, Any]:
    from dbos import DBOS, DBOSConfig, SetWorkflowID

    ready = time.monotonic()
    DBOS(config=DBOSConfig(name="bench-recovery", system_database_url=job.url))
    finished, marks = threading.Event(), dict[str, float]()

    @DBOS.step()
    def dbos_tool(i: int) -> dict[str, int]:
        return job.invoke(i)

    @DBOS.workflow()
    def loop(steps: int) -> int:
        marks.setdefault("started", time.monotonic())  # in the recovering process: the queue took it
        for i in range(1, steps + 1):
            dbos_tool(i)
        marks["done"] = time.monotonic()  # step N's output is recorded: the recovery is over
        finished.set()
        return steps

    DBOS.launch()  # the recovering process: re-enqueues the executor's pending workflows
    if job.first:
        with SetWorkflowID(job.ident):
            loop(job.steps)
    # waiting on the event, not on get_result's one-second polling, times the workflow itself
    assert finished.wait(120), "DBOS did not recover the workflow"
    assert DBOS.retrieve_workflow(job.ident).get_result() == job.steps
    DBOS.destroy()
    return {"ready": ready, "done": marks["done"], "started": marks["started"]}


JOBS: dict[str, Callable[[Job], dict[str, Any]]] = {"baton": baton_job, "langgraph": langgraph_job, "dbos": dbos_job}


def crash_and_recover(name: str, url: str, workdir: Path, steps: int, kill_at: int) -> dict[str, Any]:
    """One round of ``name``: a process killed at step ``kill_at``, then the timed recovering process."""
    ident = f"{name}-{uuid.uuid4().hex[:8]}"
    log = workdir / f"{ident}.log"

    def command(phase: str, kill: int) -> list[str]:
        ids = [f"--ident={ident}", f"--log={log}", f"--steps={steps}", f"--kill-at={kill}"]
        return [sys.executable, __file__, "--child", name, "--phase", phase, "--url", url, *ids]

    killed = subprocess.run(command("first", kill_at), capture_output=True, text=True, check=False)
    if killed.returncode != -signal.SIGKILL:
        raise RuntimeError(f"{name}'s first process was not killed (rc {killed.returncode}):\n{killed.stderr}")
    spawned = time.monotonic()  # CLOCK_MONOTONIC: the same clock in the child
    done = subprocess.run(command("second", 0), capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{name}'s recovering process failed:\n{done.stderr}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    keys = [line.split("\t")[0] for line in log.read_text().splitlines()]
    report |= {
        "seconds": report["done"] - spawned,
        "startup": report["ready"] - spawned,
        "invocations": len(keys),
        "killed_step_runs": keys.count(f"{ident}/op-{kill_at}"),
    }
    if "started" in report:  # DBOS: when its queue thread began the recovered workflow, after the spawn
        report["workflow_started"] = report.pop("started") - spawned
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--steps", type=int, default=1000, help="steps per run")
    parser.add_argument("--kill-at", type=int, default=500, help="the step inside which the first process dies")
    parser.add_argument("--rounds", type=int, default=5, help="crash-and-recover rounds per contender")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--child", choices=JOBS, help=argparse.SUPPRESS)
    for hidden in ("--phase", "--url", "--ident", "--log"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(JOBS[args.child](Job(args))))
        return 0
    info = machine_info()
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in JOBS}
    with LocalPostgres() as server, tempfile.TemporaryDirectory() as workdir:
        urls = {name: server.create_database(f"bench_recovery_{name}") for name in JOBS}
        import baton

        baton.init_store(urls["baton"])
        names = list(JOBS)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                result = crash_and_recover(name, urls[name], Path(workdir), args.steps, args.kill_at)
                rounds[name].append(result)
                extra = {k: v for k, v in result.items() if k not in {"ready", "done", "seconds", "startup"}}
                print(f"round {r} {name}: {result['seconds']:.3f} s {extra}", file=sys.stderr)
    info["loadavg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())

    def median(name: str, key: str) -> float:
        return float(statistics.median(result[key] for result in rounds[name]))

    print("| | " + " | ".join(f"{k}: {v}" for k, v in info.items()) + " |\n")
    print(f"{args.steps} steps, killed inside step {args.kill_at}, {args.rounds} rounds, medians\n")
    columns = f"recovery s | start-up s | after start-up s | invocations | step {args.kill_at} ran | / baton"
    print(f"| contender | {columns} |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    summary: dict[str, dict[str, float]] = {}
    for name in JOBS:
        seconds, startup = median(name, "seconds"), median(name, "startup")
        invocations = sorted({result["invocations"] for result in rounds[name]})
        runs = sorted({result["killed_step_runs"] for result in rounds[name]})
        ratio = seconds / median("baton", "seconds")
        summary[name] = {"seconds": seconds, "startup": startup, "ratio": ratio}
        print(
            f"| {name} | {seconds:.3f} | {startup:.3f} | {seconds - startup:.3f} "
            f"| {'/'.join(map(str, invocations))} | {'/'.join(map(str, runs))} | {ratio:.2f}x |"
        )
    for key in ("takeover_waits", "intent_reconciled", "audit_ok"):  # the takeover's refusals, then the checks
        print(f"\nbaton {key} per round: {[result[key] for result in rounds['baton']]}", end="")
    print()
    met = summary["langgraph"]["ratio"] >= 1 and all(r["invocations"] == args.steps for r in rounds["baton"])
    print(f"goal (LangGraph / Baton >= 1, Baton exactly {args.steps} invocations): {'met' if met else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "rounds": rounds, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
