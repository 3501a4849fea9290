"""A real pydantic-ai agent loop for the BatonAgent tests: offline models, a tool that counts itself.

The model (``FunctionModel``) asks for ``TURNS`` tool calls, one per request, then answers. Every
model request and every tool invocation appends one line to a count file *before* it returns, so
the file is the outside world's record of what was really called, across processes. Run as a
script (``python agent_support.py URL RUN_ID COUNTS MODEL [--kill-tool K | --kill-model K]``) it
drives one run in a process of its own, which kills itself with SIGKILL at the K-th tool call
(after the call took effect) or inside the K-th model request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from baton.adapters.agents import BatonAgent, idempotency_key
from baton.adapters.bootstrap import open_ledger
from baton.adapters.clock import Clock
from baton.adapters.worker import LedgerTransport, Worker
from baton.domain.budgets import Price
from baton.domain.events import Placement

TURNS = 6
PRICES = {"model-x": Price(1_000_000, 4_000_000), "model-y": Price(15_000_000, 60_000_000)}


def counted(path: Path) -> list[dict[str, Any]]:
    """The lines of a count file, one per real model request or tool invocation."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _append(path: Path, line: dict[str, Any]) -> None:
    with path.open("a") as out:
        out.write(json.dumps(line) + "\n")
        out.flush()
        os.fsync(out.fileno())


def build_agent(
    counts: Path,
    model_name: str,
    *,
    kill_tool: int = 0,
    kill_model: int = 0,
    pause: Callable[[int], Awaitable[None]] | None = None,
) -> Agent[None, str]:
    """The agent: ``TURNS`` tool calls, then a final answer. ``kill_*`` count from 1 within this
    process; ``pause`` is awaited inside each model request with its number (from 1)."""
    seen = {"model": 0, "tool": 0}

    async def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returned = sum(1 for m in messages for p in m.parts if p.part_kind == "tool-return")
        seen["model"] += 1
        _append(counts, {"kind": "model", "model": model_name, "after": returned})
        if seen["model"] == kill_model:
            os.kill(os.getpid(), signal.SIGKILL)
        if pause is not None:
            await pause(seen["model"])
        if returned < TURNS:
            return ModelResponse(parts=[ToolCallPart("lookup", {"item": returned, "weight": returned / 4})])
        return ModelResponse(parts=[TextPart(f"looked up {returned} items")])

    agent: Agent[None, str] = Agent(FunctionModel(answer, model_name=model_name), name="inventory")

    @agent.tool_plain
    def lookup(item: int, weight: float) -> dict[str, Any]:
        """Look an item up (the effect: one line in the count file, with the key it was given)."""
        seen["tool"] += 1
        _append(counts, {"kind": "tool", "item": item, "key": idempotency_key()})
        if seen["tool"] == kill_tool:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"item": item, "stock": item * 10, "weight": weight}

    return agent


def worker(url: str, name: str, model: str, *, clock: Clock | None = None, **kwargs: Any) -> Worker:
    """A worker on its own ledger (its own connections, as another process would have)."""
    ledger = open_ledger(url, clock=clock)
    placement = Placement(name, model=model, provider="offline", tool_contracts=("model-request", "lookup"))
    return Worker(placement, LedgerTransport(ledger), ledger, **kwargs)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    for name in ("url", "run_id", "counts", "model"):
        parser.add_argument(name)
    parser.add_argument("--kill-tool", type=int, default=0)
    parser.add_argument("--kill-model", type=int, default=0)
    args = parser.parse_args(argv)
    agent = build_agent(Path(args.counts), args.model, kill_tool=args.kill_tool, kill_model=args.kill_model)
    durable = BatonAgent(agent, worker(args.url, f"worker-{os.getpid()}", args.model), prices=PRICES)
    result = asyncio.run(durable.run("count the stock", run_id=args.run_id, lease_wait_s=30))
    print(result.output)


if __name__ == "__main__":
    main(sys.argv[1:])
