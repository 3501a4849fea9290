"""How a pydantic-ai model request or tool call is written into a Baton run, and read back.

Replay is checked byte for byte (docs/resumability.md), so what an intent records must be what a
resuming process regenerates from the same prompt and the recorded answers: a model request is
named by a digest of its messages and tool definitions without the fields a new process makes
afresh (timestamps, the requesting model's id; the run id is Baton's); a tool call by its name and
arguments. Results are kept as JSON text: the ledger's canonical form has no floats, and a model's
answer or a tool's result may hold any.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import pydantic_core
from pydantic import TypeAdapter
from pydantic_ai.durable_exec import CallToolResult
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter
from pydantic_ai.models import ModelRequestParameters

from baton.domain.budgets import Price, Usage
from baton.domain.errors import Malformed
from baton.domain.events import IntentContext

__all__ = [
    "MODEL_CONTRACT",
    "decode_result",
    "encode_result",
    "request_context",
    "request_usage",
    "tool_context",
    "tool_return",
]

MODEL_CONTRACT = "model-request"  # the tool contract of every model request, whichever model answers
# made afresh by each process: the clock, and the requesting model's id pydantic-ai stamps on every
# answer it hands on (a moved run's recorded answers keep their ``model_name``, the model that gave them)
_VOLATILE = frozenset({"timestamp", "model_id"})
_call_results: TypeAdapter[Any] = TypeAdapter(CallToolResult)


def request_context(turn: int, messages: Sequence[ModelMessage], parameters: ModelRequestParameters) -> IntentContext:
    """A model request as its intent records it: which conversation and which tools it asks about.

    The model is not part of it: a run that moves to another model replays the same prefix, and
    the recorded answer names the model that gave it.
    """
    history = ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")
    tools = [
        (tool.name, tool.parameters_json_schema) for tool in (*parameters.function_tools, *parameters.output_tools)
    ]
    arguments = {"messages": _digest(_stable(history)), "message_count": len(history), "tools": _digest(tools)}
    return IntentContext(turn, "model.request", effect="model", arguments=arguments)


def tool_context(turn: int, name: str, args: object) -> IntentContext:
    """A tool call as its intent records it: the tool and its arguments, as the model gave them."""
    return IntentContext(turn, name, effect="tool", arguments={"args": pydantic_core.to_json(args).decode()})


def encode_result(payload: object) -> dict[str, str]:
    """The journal payload as the observation's inline result."""
    return {"json": pydantic_core.to_json(payload).decode()}


def decode_result(result: Any) -> object:
    if not isinstance(result, Mapping) or not isinstance(result.get("json"), str):
        raise Malformed("the recorded result is not a pydantic-ai journal payload")
    return msgspec.json.decode(result["json"])


def tool_return(value: object) -> dict[str, str]:
    """The recorded result for a tool call settled ``applied`` by hand: ``value`` is what the tool
    returned, found outside the run (the same form a recorded call takes, so replay returns it)."""
    recorded = _call_results.validate_python({"kind": "tool_return", "result": value})
    return encode_result(_call_results.dump_python(recorded, mode="json"))


def request_usage(payload: object, prices: Mapping[str, Price] | None, model_name: str) -> Usage:
    """Tokens are fuel; the answering model's price makes the cost. A priced run refuses an unpriced model."""
    usage = payload.get("usage") if isinstance(payload, Mapping) else None
    tokens_in = int(usage.get("input_tokens") or 0) if isinstance(usage, Mapping) else 0
    tokens_out = int(usage.get("output_tokens") or 0) if isinstance(usage, Mapping) else 0
    if prices is None:
        return Usage(fuel=tokens_in + tokens_out)
    price = prices.get(model_name)
    if price is None:
        raise Malformed(f"no price for model {model_name!r}: this run's budget counts cost ({sorted(prices)})")
    return Usage(fuel=tokens_in + tokens_out, cost_micros=price.cost_micros(tokens_in, tokens_out))


def _stable(value: Any) -> Any:
    """``value`` without the fields a new process makes afresh."""
    if isinstance(value, dict):
        return {key: _stable(item) for key, item in value.items() if key not in _VOLATILE}
    if isinstance(value, list):
        return [_stable(item) for item in value]
    return value


def _digest(value: Any) -> str:
    return "sha256:" + hashlib.sha256(pydantic_core.to_json(value)).hexdigest()
