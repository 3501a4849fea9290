"""pydantic-ai's durable-execution interface, backed by a Baton run.

pydantic-ai routes every model request and tool call of a durable agent through one backend call
(``CallableOperationBackend.execute``); this backend makes each one a recorded operation of the run:

- a **model request** is *pure* (it changes nothing outside the run): it is asked, then its intent
  and its answer are appended together, with its tokens as fuel and its price as cost;
- a **tool call** is an *effect*: its intent is durable before the tool runs, its observation after;
  the tool can read the idempotency key it should pass on with ``idempotency_key()``.

While the run replays (a new process resuming the same run), each regenerated operation is offered
to the ledger's replay cursor, which returns the recorded answer without calling the model or the
tool, or raises ``ReplayDivergence`` if the agent now asks something else. An operation the log
settled as not done (``failed``, ``not_applied``, ``abandoned``) is asked again under a new op id.
Tool calls run one at a time, so the order of the operations, and with it replay, is deterministic.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    CallableOperationBackend,
    DurabilityEngineSpec,
    DurableOperationId,
    JournalOperationNamer,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
)

from baton.adapters.agents import records
from baton.adapters.worker import Resumed, Worker
from baton.domain.budgets import Price
from baton.domain.commands import RecordObservation
from baton.domain.decide import context_digest
from baton.domain.errors import Malformed
from baton.domain.events import IntentContext

__all__ = ["AgentRun", "BatonDurability", "idempotency_key"]

_KEY: ContextVar[str | None] = ContextVar("baton_idempotency_key", default=None)
_REDO = frozenset({"failed", "not_applied", "abandoned"})


def idempotency_key() -> str | None:
    """Inside a tool call of a Baton-durable agent: the key (``RUN/OP``) to pass on to the outside
    world, so that a reconciliation can ask whether this very call took effect."""
    return _KEY.get()


@dataclass
class AgentRun:
    """One run's operations as they are replayed or recorded: the op ids in order, the cursor."""

    worker: Worker
    run_id: str
    resumed: Resumed | None
    prices: Mapping[str, Price] | None = None
    turn: int = 0
    replayed: int = 0
    asked: int = field(default=0)

    def _next_op(self) -> tuple[int, str]:
        turn, self.turn = self.turn, self.turn + 1
        return turn, f"op-{turn}"

    def _replayed(self, kind: str, contract: str, context_of: Callable[[int], IntentContext]) -> object | None:
        """The recorded payload for the next operation while the cursor has one, else ``None``."""
        cursor = self.resumed.cursor if self.resumed is not None else None
        while cursor is not None and not cursor.consumed:
            turn, op_id = self.turn, f"op-{self.turn}"
            step = cursor.offer(op_id, kind, contract, context_of(turn))  # ReplayDivergence if it differs
            self.turn += 1
            if step is not None and step.outcome not in _REDO:
                self.replayed += 1
                return records.decode_result(step.result)
        return None

    async def model_request(self, operation: ModelRequestId, messages: Any, parameters: Any, body: Body) -> object:
        def context_of(turn: int) -> IntentContext:
            return records.request_context(turn, messages, parameters)

        recorded = self._replayed("pure", records.MODEL_CONTRACT, context_of)
        if recorded is not None:
            return recorded
        turn, op_id = self._next_op()
        context = context_of(turn)
        payload = await body()
        self.asked += 1
        answered_by = payload.get("model_name") if isinstance(payload, dict) else None
        usage = records.request_usage(payload, self.prices, answered_by or operation.model_name)
        result = records.encode_result(payload)
        await asyncio.to_thread(
            self.worker.record_pure, self.run_id, op_id, records.MODEL_CONTRACT, context, result, usage=usage
        )
        return payload

    async def tool_call(self, name: str, args: object, body: Body) -> object:
        def context_of(turn: int) -> IntentContext:
            return records.tool_context(turn, name, args)

        recorded = self._replayed("effect", name, context_of)
        if recorded is not None:
            return recorded
        turn, op_id = self._next_op()
        context = context_of(turn)
        await asyncio.to_thread(self.worker.intend, self.run_id, op_id, name, context)
        token = _KEY.set(f"{self.run_id}/{op_id}")
        try:
            payload = await body()
        except Exception:
            failed = RecordObservation(op_id, context_digest(context), "failed", "tool_error")
            await asyncio.to_thread(self.worker.submit, self.run_id, failed)
            raise
        finally:
            _KEY.reset(token)
        self.asked += 1
        result = records.encode_result(payload)
        await asyncio.to_thread(self.worker.observe, self.run_id, op_id, context, result)
        return payload


Body = Callable[[], Awaitable[object]]


class _Backend(CallableOperationBackend[None]):
    def __init__(self, run: AgentRun, agent_name: str) -> None:
        none = RoleBasedOperationConfig[None](model=None, event=None, capability=None, tool=None)
        super().__init__(namer=JournalOperationNamer(agent_name), config=none)
        self.run = run

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Body,
        cache_key: tuple[object, ...],
        config: None,
    ) -> object:
        if isinstance(operation_id, ModelRequestId):
            _, messages, _, parameters, *_ = cache_key
            return await self.run.model_request(operation_id, messages, parameters, body)
        if isinstance(operation_id, ToolsetCallToolId):
            tool_name, args, *_ = cache_key
            return await self.run.tool_call(str(tool_name), args, body)
        # streaming, compaction, event handlers, capability operations: not recorded by this release
        raise Malformed(f"a Baton-durable agent cannot record {type(operation_id).__name__} ({name}) yet")


class BatonDurability(BaseDurabilityCapability[Any]):
    """The capability ``BatonAgent`` adds to each run of the agent it wraps: one per run."""

    engine_spec = DurabilityEngineSpec(
        engine_name="Baton",
        durable_unit_noun="operation",
        durable_container_noun="run",
        codec=JSON_CODEC,  # journal payloads are JSON: the ledger stores them as text
        wrapped_toolset_kinds=frozenset({"function"}),
        toolset_lifecycles={"function": "enter-always"},
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        journal_discovery=False,  # function tools are discovered from code, the same in every process
        sequential_tools_in_durable_context=True,  # one order of operations, so replay is exact
    )

    def __init__(self, run: AgentRun, *, name: str) -> None:
        super().__init__(name=name)
        self._run = run

    @property
    def in_durable_context(self) -> bool:
        return True

    def get_durable_operation_backend(self) -> _Backend:
        return _Backend(self._run, self.name)
