"""``BatonAgent``: a pydantic-ai ``Agent`` whose runs are Baton runs.

The agent itself stays a plain pydantic-ai agent; each ``run`` adds a ``BatonDurability``
capability bound to one Baton run. What the wrapper owns is the run's life around the agent loop:
open it, take its lease (fenced: a second process driving the same run is refused), resume it
(replaying what the log recorded), and close it. A move to another worker, model or provider is a
lease moving: the new worker names its model in its placement, replays the prefix the old model
answered, and its own model answers only what is new, on the same budgets.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.agent import AgentRunResult

from baton.adapters.agents import records
from baton.adapters.agents.durability import AgentRun, BatonDurability
from baton.adapters.worker import Resumed, Worker
from baton.domain import errors
from baton.domain.budgets import Ceilings, Price
from baton.projections.resumability import ResumabilityClass, summary_of

__all__ = ["SCHEMA", "BatonAgent", "UncertainCall"]

SCHEMA = ("pydantic-ai-agent", 1)  # the run's task state schema: {"agent": name}
_UNBOUNDED = Ceilings()
_ABANDONED_REQUEST = "a model request in flight when its worker stopped changes nothing outside the run: asked again"


@dataclass(frozen=True)
class UncertainCall:
    """A tool call whose intent is recorded and whose outcome is not: ask the outside world about
    ``idempotency_key``, then ``settle`` it."""

    op_id: str
    tool: str
    arguments: str
    idempotency_key: str
    position: int


class BatonAgent:
    """Runs ``agent`` as Baton runs, through ``worker`` (its placement, key, lease and transport)."""

    def __init__(
        self,
        agent: Agent[Any, Any],
        worker: Worker,
        *,
        prices: Mapping[str, Price] | None = None,
        ceilings: Ceilings = _UNBOUNDED,
        release: str = "pydantic-ai",
    ) -> None:
        """``prices``: per model name (the name the answer carries); with them every answer is charged
        ``cost_micros`` and an unpriced model is refused. ``ceilings``: the budget a new run opens with.
        """
        self.agent, self.worker = agent, worker
        self.name = agent.name or "agent"
        self.prices, self.ceilings, self.release = prices, ceilings, release

    @property
    def contracts(self) -> tuple[str, ...]:
        """The tool contracts this agent's runs record: a worker's placement must name them all."""
        tools = sorted(name for toolset in self.agent.toolsets for name in getattr(toolset, "tools", {}))
        return (records.MODEL_CONTRACT, *tools)

    async def run(
        self, user_prompt: str | Sequence[Any] | None = None, *, run_id: str, lease_wait_s: float = 0.0, **kwargs: Any
    ) -> AgentRunResult[Any]:
        """Run (or resume) ``run_id``: the recorded prefix is replayed without calling the model or any
        tool, then the agent goes on; the run is completed when the agent returns.

        ``lease_wait_s``: how long to wait for a lease another worker holds (a process just killed holds
        it until the store sees its session end). Raises ``UncertainIntent`` when a tool call has no
        recorded outcome (``uncertain`` and ``settle`` deal with it), ``MigrationUnsafe`` when this
        worker cannot honour the run, ``BudgetExceeded`` (the run is then failed) and, fenced, ``StaleEpoch``.
        Other keyword arguments go to ``Agent.run``.
        """
        await asyncio.to_thread(self._take, run_id, lease_wait_s)
        try:
            resumed = await asyncio.to_thread(self._resume, run_id)
            run = AgentRun(self.worker, run_id, resumed, self.prices)
            capability = BatonDurability(run, name=self.name)
            try:
                result = await self.agent.run(
                    user_prompt, run_id=run_id, conversation_id=run_id, capabilities=[capability], **kwargs
                )
            except errors.BudgetExceeded as exc:
                await asyncio.to_thread(self.worker.fail, run_id, exc.reason, exc.message)
                raise
            await asyncio.to_thread(self.worker.complete, run_id, str(result.output)[:200])
            return result
        finally:
            await asyncio.to_thread(self._let_go, run_id)

    def uncertain(self, run_id: str) -> list[UncertainCall]:
        """The run's tool calls with no recorded outcome (read from the log)."""
        outline = summary_of(self.worker.reader.resume_fold(run_id)).prefix
        return [
            UncertainCall(
                step.op_id,
                step.tool_contract,
                str(step.context.arguments.get("args", "")),
                f"{run_id}/{step.op_id}",
                step.intent_position,
            )
            for step in outline.uncertain
            if step.kind == "effect"
        ]

    def settle(self, run_id: str, op_id: str, *, applied: bool, evidence: str, returned: object = None) -> None:
        """Settle an uncertain tool call on ``evidence``: it took effect and returned ``returned`` (the
        run replays that as the call's result), or it never did (it is called again)."""
        self._take(run_id, 0.0)
        try:
            if applied:
                self.worker.applied(run_id, op_id, evidence, result=records.tool_return(returned))
            else:
                self.worker.not_applied(run_id, op_id, evidence)
        finally:
            self._let_go(run_id)

    # -- the run's life around the agent loop ----------------------------------------------------
    def _take(self, run_id: str, wait_s: float) -> None:
        if not self.worker.reader.state(run_id).opened:
            # another process may have opened it first: then the lease decides who drives it
            with contextlib.suppress(errors.RunAlreadyExists):
                self.worker.open_run(run_id, self.release, SCHEMA, {"agent": self.name}, self.ceilings)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.worker.acquire(run_id)
                return
            except errors.LeaseHeld:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)

    def _resume(self, run_id: str) -> Resumed:
        """The cursor to replay through, once model requests left in flight are settled (asked again)."""
        resumed = self.worker.resume(run_id)
        pure = [step for step in resumed.cursor.uncertain if step.kind == "pure"]
        for step in pure:
            self.worker.abandoned(run_id, step.op_id, _ABANDONED_REQUEST)
        if pure:
            resumed = self.worker.resume(run_id)
        verdict = resumed.resumability
        if verdict.cls is ResumabilityClass.MIGRATION_UNSAFE:
            raise errors.MigrationUnsafe("; ".join(verdict.reasons))
        if resumed.cursor.uncertain:
            open_calls = resumed.cursor.uncertain
            calls = ", ".join(f"{s.op_id} ({s.tool_contract}, key {run_id}/{s.op_id})" for s in open_calls)
            raise errors.UncertainIntent(f"tool calls with no recorded outcome: {calls}: settle them first")
        return resumed

    def _let_go(self, run_id: str) -> None:
        """Give the lease up (its renewal stops first), so the next worker need not wait for its ttl."""
        with contextlib.suppress(errors.BatonError):  # fenced, or the run is closed: nothing left to give up
            self.worker.release(run_id)
