"""Durable pydantic-ai agents (issue 32): BatonAgent against pydantic-ai's DBOS integration on one PostgreSQL.

    python bench/agents.py [--turns N] [--rounds R] [--kill-at K] [--recoveries M] [--json FILE]

One agent, offline and deterministic: a ``FunctionModel`` answers each request with one call of the
tool ``step(i)`` until it has seen N tool returns (20), then with final text. The model function and
the tool append one line per invocation to a file, so repeats are counted from the effects, not
from what a framework says it did. One embedded PostgreSQL (fsync on) serves both, each in its own
database.

- **baton**: ``baton.BatonAgent(agent, worker)`` on a PostgreSQL ledger. A model request is asked,
  then recorded with its answer in one transaction; a tool call's intent is committed before the
  tool runs and its observation after. Three commits per turn.
- **dbos**: ``Agent(..., capabilities=[DBOSDurability()])`` awaited inside a ``@DBOS.workflow``, the
  current pydantic-ai way (``DBOSAgent`` is its deprecated wrapper of the same steps). Each model
  request is a DBOS step; function tools are not wrapped by the capability, so the tool is a
  ``@DBOS.step`` itself, as pydantic-ai's docs tell a tool with I/O to be. Two step commits per turn,
  plus the workflow's own rows.

Measured:

1. **Time per turn**: one durable N-turn run (open or start the workflow, N turns, complete) / N,
   median over R rounds that alternate the contenders, each round a fresh run. Goal: DBOS / Baton >= 3.
2. **Recovery after kill -9**: a process runs the agent and kills itself with SIGKILL right after
   tool call K (10) took effect. A new process then recovers and finishes the run: Baton takes the
   lease over (as soon as PostgreSQL sees the killed session gone), stops on the uncertain call,
   settles it ``applied`` from the tool's log and runs again, replaying the prefix; DBOS's
   ``DBOS.launch()`` re-enqueues the pending workflow, which re-runs the step in flight. Time from
   the spawn to the run's end (interpreter start and imports included; start-up reported apart),
   and the repeated invocations. Goal: Baton faster than DBOS.
"""

from __future__ import annotations

import argparse
import asyncio
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
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import machine_info

APP, APP_VERSION = "bench-agents-dbos", "bench-agents-1"  # pinned: DBOS recovers only its own version
RECOVERY_TIMEOUT_S = 120.0
TAKEOVER_TIMEOUT_S = 40.0  # past the lease's 30 s ttl: a takeover that waits this long has failed


class Workload:
    """Where this process's model and tool log their invocations, and the tool invocation that dies."""

    def __init__(self, workdir: Path, kill_at: int = 0) -> None:
        self.tool_log, self.model_log = workdir / "tool.log", workdir / "model.log"
        self.kill_at = kill_at  # 1-based count of tool invocations in this process; 0: never
        self.tool_calls = 0
        self.marks: dict[str, float] = {}  # DBOS: workflow id -> when its agent run returned
        self.finished = threading.Event()

    def invoke(self, ident: str, i: int) -> dict[str, int]:
        """The tool's effect: one line, flushed before returning, so a kill -9 right after keeps it."""
        _append(self.tool_log, f"{ident}\t{i}")
        self.tool_calls += 1
        if self.tool_calls == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return tool_result(i)

    def answer(self, ident: str, messages: list[Any]) -> Any:
        """One ``step`` call per request until N tool returns are in the history; N is in the prompt."""
        from pydantic_ai.messages import (
            ModelRequest,
            ModelResponse,
            TextPart,
            ToolCallPart,
            ToolReturnPart,
            UserPromptPart,
        )

        parts = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts]
        done = sum(isinstance(p, ToolReturnPart) for p in parts)
        turns = int(next(p.content for p in parts if isinstance(p, UserPromptPart)).split("=")[1])
        _append(self.model_log, f"{ident}\t{done}")
        if done < turns:
            return ModelResponse(parts=[ToolCallPart("step", {"i": done + 1}, tool_call_id=f"call-{done + 1}")])
        return ModelResponse(parts=[TextPart(f"done after {turns} steps")])


def tool_result(i: int) -> dict[str, int]:
    return {"i": i, "square": i * i}


def _append(path: Path, line: str) -> None:
    with path.open("a") as f:
        f.write(line + "\n")
        f.flush()


def count(path: Path) -> dict[str, int]:
    """Invocations in a log, and how many of them repeated an (id, argument) already logged."""
    lines = path.read_text().splitlines() if path.exists() else []
    return {"invocations": len(lines), "repeated": len(lines) - len(set(lines))}


# -- baton ------------------------------------------------------------------------------------------
class BatonDriver:
    """The workload as a plain pydantic-ai agent, durable through a worker on its own ledger."""

    def __init__(self, url: str, work: Workload, name: str) -> None:
        from pydantic_ai import Agent
        from pydantic_ai.models.function import FunctionModel

        import baton

        self.run_id = ""  # the model's log lines name the run, as DBOS's name the workflow
        agent = Agent(FunctionModel(lambda messages, info: work.answer(self.run_id, messages)), name="bench_agent")

        @agent.tool_plain
        def step(i: int) -> dict[str, int]:
            return work.invoke(baton.idempotency_key() or "", i)  # the key is what a reconciliation looks for

        ledger = baton.open_ledger(url)
        placement = baton.Placement(name, model="function", tool_contracts=("model-request", "step"))
        self.durable = baton.BatonAgent(agent, baton.Worker(placement, baton.LedgerTransport(ledger), ledger))

    async def run(self, turns: int, run_id: str, **kwargs: Any) -> Any:
        self.run_id = run_id
        return await self.durable.run(f"turns={turns}", run_id=run_id, **kwargs)

    def close(self) -> None:
        self.durable.worker.close()
        self.durable.worker.reader.close()


def baton_child(phase: str, url: str, ident: str, workdir: Path, n: int, kill_at: int) -> dict[str, Any]:
    """``first`` runs until the tool kills it; ``second`` takes the run over, settles the uncertain
    call from the tool's log (the key is there: the effect happened) and finishes the run."""
    import baton

    ready = time.monotonic()
    driver = BatonDriver(url, Workload(workdir, kill_at), phase)
    durable = driver.durable
    if phase == "first":
        asyncio.run(driver.run(n, ident))
        raise AssertionError(f"the tool was not killed at invocation {kill_at}")
    try:
        asyncio.run(driver.run(n, ident, lease_wait_s=TAKEOVER_TIMEOUT_S))
    except baton.errors.UncertainIntent:
        logged = dict(line.split("\t") for line in (workdir / "tool.log").read_text().splitlines())
        for call in durable.uncertain(ident):
            if call.idempotency_key in logged:
                returned = tool_result(int(logged[call.idempotency_key]))
                evidence = f"tool.log: {call.idempotency_key}"
                durable.settle(ident, call.op_id, applied=True, evidence=evidence, returned=returned)
            else:
                durable.settle(ident, call.op_id, applied=False, evidence="not in tool.log")
        asyncio.run(driver.run(n, ident))
    done = time.monotonic()
    driver.close()
    return {"ready": ready, "done": done}


# -- dbos -------------------------------------------------------------------------------------------
class Current:
    """The workload DBOS's steps use: DBOS recovers a workflow from its recorded inputs only."""

    work: Workload | None = None


def _work() -> Workload:
    assert Current.work is not None
    return Current.work


@functools.cache
def dbos_app() -> Callable[[int], Coroutine[Any, Any, dict[str, Any]]]:
    """Register the tool step, the agent (its model steps) and the workflow once, before launch."""
    from dbos import DBOS
    from pydantic_ai import Agent, Tool
    from pydantic_ai.durable_exec.dbos import DBOSDurability
    from pydantic_ai.models.function import FunctionModel

    @DBOS.step()
    def step(i: int) -> dict[str, int]:
        return _work().invoke(str(DBOS.workflow_id), i)

    def answer(messages: list[Any], info: Any) -> Any:
        return _work().answer(str(DBOS.workflow_id), messages)

    agent = Agent(
        FunctionModel(answer),
        name="bench_agent",  # names the DBOS steps: stable across processes
        tools=[Tool(step, takes_ctx=False)],
        capabilities=[DBOSDurability()],
    )

    @DBOS.workflow()
    async def agent_run(turns: int) -> dict[str, Any]:
        result = await agent.run(f"turns={turns}")
        _work().marks[str(DBOS.workflow_id)] = time.monotonic()
        _work().finished.set()
        return {"output": result.output, "requests": result.usage.requests, "tool_calls": result.usage.tool_calls}

    return agent_run


def dbos_launch(url: str) -> None:
    from dbos import DBOS, DBOSConfig

    DBOS(config=DBOSConfig(name=APP, system_database_url=url, application_version=APP_VERSION))
    dbos_app()  # registration first: launch recovers what is registered
    DBOS.launch()


def dbos_child(phase: str, url: str, ident: str, workdir: Path, n: int, kill_at: int) -> dict[str, Any]:
    """``first`` starts the workflow and dies in the tool; ``second`` launches, which recovers it."""
    from dbos import DBOS, SetWorkflowID

    ready = time.monotonic()
    work = Current.work = Workload(workdir, kill_at)
    dbos_launch(url)
    if phase == "first":
        with SetWorkflowID(ident):
            asyncio.run(dbos_app()(n))
        raise AssertionError(f"the tool was not killed at invocation {kill_at}")
    assert work.finished.wait(RECOVERY_TIMEOUT_S), "DBOS did not recover the workflow"
    done = work.marks[ident]
    DBOS.destroy()
    return {"ready": ready, "done": done}


# -- the two measurements -----------------------------------------------------------------------------
def per_turn(urls: dict[str, str], n: int, rounds: int) -> dict[str, Any]:
    """Median ms per turn of each contender, rounds alternating (baton, dbos, dbos, baton, ...)."""
    from dbos import DBOS, SetWorkflowID

    with tempfile.TemporaryDirectory() as workdir:
        work = Current.work = Workload(Path(workdir))
        dbos_launch(urls["dbos"])
        driver = BatonDriver(urls["baton"], work, "bench")
        times: dict[str, list[float]] = {"baton": [], "dbos": []}

        async def one(name: str) -> None:
            ident = f"turns-{uuid.uuid4().hex[:8]}"
            t0 = time.perf_counter()
            if name == "baton":
                usage = (await driver.run(n, ident)).usage
                done = (usage.tool_calls, usage.requests)
            else:
                with SetWorkflowID(ident):
                    result = await dbos_app()(n)
                done = (result["tool_calls"], result["requests"])
            times[name].append((time.perf_counter() - t0) / n)
            assert done == (n, n + 1), (name, done)

        async def alternate() -> None:
            for contender in ("baton", "dbos"):  # warm-up: imports, connections, prepared statements
                await one(contender)
            times["baton"].clear()
            times["dbos"].clear()
            for r in range(rounds):
                for contender in ("baton", "dbos") if r % 2 == 0 else ("dbos", "baton"):
                    await one(contender)

        asyncio.run(alternate())
        DBOS.destroy()
        driver.close()
        repeats = {"tool": count(work.tool_log)["repeated"], "model": count(work.model_log)["repeated"]}
    ms = {name: 1000 * statistics.median(t) for name, t in times.items()}
    return {"ms_per_turn": ms, "dbos_over_baton": ms["dbos"] / ms["baton"], "repeats": repeats}


def recovery(url: str, contender: str, n: int, kill_at: int) -> dict[str, Any]:
    """Kill -9 a durable run right after tool call ``kill_at``; time a new process finishing it."""
    ident = f"recovery-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as workdir:

        def child(phase: str) -> subprocess.CompletedProcess[str]:
            argv = [contender, phase, url, ident, workdir, str(n), str(kill_at if phase == "first" else 0)]
            return subprocess.run(
                [sys.executable, __file__, "--child", *argv], capture_output=True, text=True, check=False
            )

        killed = child("first")
        if killed.returncode != -signal.SIGKILL:
            rc = killed.returncode
            raise RuntimeError(f"{contender}: the first process was not killed (rc {rc}):\n{killed.stderr}")
        spawned = time.monotonic()  # CLOCK_MONOTONIC is system-wide: comparable with the child's marks
        done = child("second")
        if done.returncode:
            raise RuntimeError(f"{contender}: the recovering process failed:\n{done.stderr}")
        marks = json.loads(done.stdout.strip().splitlines()[-1])
        tool, model = count(Path(workdir) / "tool.log"), count(Path(workdir) / "model.log")
    assert tool["invocations"] - tool["repeated"] == n, (contender, tool)
    return {
        "seconds": marks["done"] - spawned,
        "startup_s": marks["ready"] - spawned,
        "repeated_tool_calls": tool["repeated"],
        "repeated_model_requests": model["repeated"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kill-at", type=int, default=10)
    parser.add_argument("--recoveries", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        contender, phase, url, ident, workdir, n, kill_at = args.child
        job = baton_child if contender == "baton" else dbos_child
        print(json.dumps(job(phase, url, ident, Path(workdir), int(n), int(kill_at))))
        return 0

    from tests.support.local_servers import LocalPostgres

    report: dict[str, Any] = {"machine": machine_info(), "turns": args.turns, "kill_at": args.kill_at}
    with LocalPostgres() as server:
        urls = {name: server.create_database(f"bench_agents_{name}") for name in ("baton", "dbos")}
        from baton.adapters.bootstrap import init_store

        init_store(urls["baton"])
        report["per_turn"] = per_turn(urls, args.turns, args.rounds)
        runs: dict[str, list[dict[str, Any]]] = {"baton": [], "dbos": []}
        for r in range(args.recoveries):
            for contender in ("baton", "dbos") if r % 2 == 0 else ("dbos", "baton"):
                runs[contender].append(recovery(urls[contender], contender, args.turns, args.kill_at))
        report["recovery"] = {
            name: {
                "seconds": statistics.median(r["seconds"] for r in rounds),
                "startup_s": statistics.median(r["startup_s"] for r in rounds),
                "repeated_tool_calls": [r["repeated_tool_calls"] for r in rounds],
                "repeated_model_requests": [r["repeated_model_requests"] for r in rounds],
            }
            for name, rounds in runs.items()
        }

    turn, rec = report["per_turn"], report["recovery"]
    print(f"{args.turns} turns per run; medians of {args.rounds} rounds ({args.recoveries} recoveries)")
    print(f"per turn: baton {turn['ms_per_turn']['baton']:.2f} ms, dbos {turn['ms_per_turn']['dbos']:.2f} ms")
    print(f"  DBOS / Baton = {turn['dbos_over_baton']:.2f}x (goal >= 3x)")
    for name, r in rec.items():
        print(
            f"recovery {name}: {r['seconds']:.3f} s (start-up {r['startup_s']:.3f} s), repeated tool calls "
            f"{r['repeated_tool_calls']}, repeated model requests {r['repeated_model_requests']}"
        )
    print(f"  DBOS / Baton = {rec['dbos']['seconds'] / rec['baton']['seconds']:.2f}x (goal > 1x)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
