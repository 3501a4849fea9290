"""How a pydantic-ai model request or tool call is recorded: stable across processes, floats kept."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, UserPromptPart
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.tools import ToolDefinition

from baton.adapters.agents import records
from baton.domain.budgets import Price, Usage
from baton.domain.errors import Malformed

LOOKUP = ToolDefinition(name="lookup", parameters_json_schema={"type": "object"})


def _history(at: datetime, model_id: str = "function:x") -> list[ModelRequest | ModelResponse]:
    response = ModelResponse(parts=[ToolCallPart("lookup", {"item": 1}, "call-1")], model_name="x", timestamp=at)
    response.model_id = model_id
    return [ModelRequest(parts=[UserPromptPart("go", timestamp=at)], timestamp=at, run_id="r1"), response]


def test_a_request_regenerated_later_by_another_model_records_the_same_context() -> None:
    """Given the same conversation rebuilt an hour later and handed on by another model, when its
    context is made, then it is byte for byte the first one (timestamps and the stamped model id are
    made afresh by each process, the answer's model name is kept)."""
    now = datetime.now(UTC)
    parameters = ModelRequestParameters(function_tools=[LOOKUP])
    first = records.request_context(2, _history(now), parameters)
    later = records.request_context(2, _history(now + timedelta(hours=1), "function:y"), parameters)
    assert first == later
    assert first.arguments["message_count"] == 2


def test_another_prompt_or_other_tools_make_another_context() -> None:
    """Given a changed prompt or a changed tool list, when the context is made, then it differs."""
    now = datetime.now(UTC)
    parameters = ModelRequestParameters(function_tools=[LOOKUP])
    base = records.request_context(0, _history(now), parameters)
    other_prompt = [ModelRequest(parts=[UserPromptPart("stop", timestamp=now)], timestamp=now, run_id="r1")]
    assert records.request_context(0, [*other_prompt, _history(now)[1]], parameters) != base
    assert records.request_context(0, _history(now), ModelRequestParameters()) != base


def test_results_and_tool_arguments_keep_floats_as_json_text() -> None:
    """Given a payload with floats (which the ledger's canonical form refuses), when it is recorded and
    read back, then it is unchanged."""
    payload = {"parts": [{"weight": 0.25}], "usage": {"audio_seconds": 0.0}}
    assert records.decode_result(records.encode_result(payload)) == payload
    assert records.tool_context(3, "lookup", {"weight": 0.5}).arguments == {"args": '{"weight":0.5}'}
    with pytest.raises(Malformed):
        records.decode_result({"parts": []})


def test_a_settled_tool_return_reads_back_as_a_recorded_call() -> None:
    """Given a tool's return found outside the run, when it is settled, then it reads back in the
    journal form of a recorded call."""
    recorded = records.decode_result(records.tool_return({"stock": 10}))
    assert isinstance(recorded, dict)
    assert recorded["kind"] == "tool_return"
    assert recorded["result"] == {"stock": 10}


def test_tokens_are_fuel_and_the_answering_models_price_is_the_cost() -> None:
    """Given an answer of 1,000 input and 10 output tokens, when it is charged, then fuel is 1,010 and
    the cost is the model's price; a priced run refuses a model without a price."""
    payload = {"usage": {"input_tokens": 1_000, "output_tokens": 10}}
    prices = {"x": Price(input_per_mtok=3_000_000, output_per_mtok=15_000_000)}
    assert records.request_usage(payload, prices, "x") == Usage(fuel=1_010, cost_micros=3_150)
    assert records.request_usage(payload, None, "y") == Usage(fuel=1_010)
    with pytest.raises(Malformed, match="no price for model 'y'"):
        records.request_usage(payload, prices, "y")
