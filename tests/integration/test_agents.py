"""BatonAgent: a real pydantic-ai agent loop (offline models, a tool that counts itself in a file)
made durable by a Baton run, on SQLite and PostgreSQL: kill -9 and resume, model moves, fencing,
budgets, signatures."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from agent_support import PRICES, TURNS, build_agent, counted, worker
from pydantic_ai.exceptions import UsageLimitExceeded
from pydantic_ai.messages import ModelResponse
from pydantic_ai.usage import UsageLimits

from baton.adapters.agents import BatonAgent
from baton.adapters.bootstrap import init_store, open_ledger, register
from baton.adapters.clock import ManualClock
from baton.adapters.identity import SigningKey
from baton.domain import errors
from baton.domain.budgets import Ceilings
from baton.domain.commands import AddPrincipal
from baton.domain.events import IntentRecorded, LeaseGranted

RUN = "agent-run-1"
SCRIPT = Path(__file__).with_name("agent_support.py")


def _process(url: str, counts: Path, model: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """Drive the run in a process of its own (killed by ``flags``, or to the end)."""
    argv = [sys.executable, str(SCRIPT), url, RUN, str(counts), model, *flags]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def _kinds(counts: Path, kind: str) -> list[dict[str, Any]]:
    return [line for line in counted(counts) if line["kind"] == kind]


def _history(url: str) -> list[Any]:
    ledger = open_ledger(url)
    try:
        ledger.verify(RUN)
        return list(ledger.history(RUN))
    finally:
        ledger.close()


def _usage_of(responses: list[ModelResponse]) -> tuple[int, int]:
    """(fuel, cost) the responses should have charged: their tokens, at their own model's price."""
    fuel = sum(r.usage.input_tokens + r.usage.output_tokens for r in responses)
    cost = sum(PRICES[r.model_name or ""].cost_micros(r.usage.input_tokens, r.usage.output_tokens) for r in responses)
    return fuel, cost


def test_killed_inside_a_tool_call_the_run_stops_for_reconciliation_then_resumes_without_repeats(
    store_url: str, tmp_path: Path
) -> None:
    """Given a process killed by SIGKILL right after its 3rd tool call took effect, when a new worker
    resumes, then it stops on the uncertain call; settled from the outside world's record, the run
    finishes in a third process with every tool call and every model request made exactly once."""
    init_store(store_url)
    counts = tmp_path / "counts.jsonl"
    killed = _process(store_url, counts, "model-x", "--kill-tool", "3")
    assert killed.returncode == -9, killed.stderr

    durable = BatonAgent(build_agent(counts, "model-x"), worker(store_url, "reconciler", "model-x"), prices=PRICES)
    with pytest.raises(errors.UncertainIntent, match="lookup"):
        asyncio.run(durable.run("count the stock", run_id=RUN, lease_wait_s=30))
    [call] = durable.uncertain(RUN)
    [found] = [line for line in _kinds(counts, "tool") if line["key"] == call.idempotency_key]  # the effect happened
    item = found["item"]
    durable.settle(
        RUN,
        call.op_id,
        applied=True,
        evidence=f"counts.jsonl: {call.idempotency_key}",
        returned={"item": item, "stock": item * 10, "weight": item / 4},
    )
    durable.worker.close()

    finished = _process(store_url, counts, "model-x")
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.strip() == f"looked up {TURNS} items"
    assert [line["item"] for line in _kinds(counts, "tool")] == list(range(TURNS))
    assert [line["after"] for line in _kinds(counts, "model")] == list(range(TURNS + 1))
    assert sum(isinstance(e.body, IntentRecorded) for e in _history(store_url)) == 2 * TURNS + 1


def test_killed_inside_a_model_request_only_that_request_is_asked_again(store_url: str, tmp_path: Path) -> None:
    """Given a process killed inside its 3rd model request (never recorded: a model request changes
    nothing outside the run), when a new process runs the same run id, then the recorded prefix is
    replayed without calling the model or the tool, and only the request in flight is asked again."""
    init_store(store_url)
    counts = tmp_path / "counts.jsonl"
    assert _process(store_url, counts, "model-x", "--kill-model", "3").returncode == -9

    finished = _process(store_url, counts, "model-x")
    assert finished.returncode == 0, finished.stderr
    asked = Counter(line["after"] for line in _kinds(counts, "model"))
    assert asked == {**dict.fromkeys(range(TURNS + 1), 1), 2: 2}
    assert [line["item"] for line in _kinds(counts, "tool")] == list(range(TURNS))


def test_a_run_moves_from_model_x_to_model_y_with_the_prefix_replayed_and_exact_budgets(
    store_url: str, tmp_path: Path
) -> None:
    """Given a run that model X answered three requests of, when worker bob on model Y takes it on,
    then X's answers are replayed, Y answers only the new requests, the leases name each model, and
    the run's fuel and cost are exactly each answer's tokens at its own model's price."""
    init_store(store_url)
    counts = tmp_path / "counts.jsonl"
    alice = BatonAgent(build_agent(counts, "model-x"), worker(store_url, "alice", "model-x"), prices=PRICES)
    with pytest.raises(UsageLimitExceeded):
        asyncio.run(alice.run("count the stock", run_id=RUN, usage_limits=UsageLimits(request_limit=3)))
    bob = BatonAgent(build_agent(counts, "model-y"), worker(store_url, "bob", "model-y"), prices=PRICES)
    result = asyncio.run(bob.run("count the stock", run_id=RUN))

    responses = [m for m in result.all_messages() if isinstance(m, ModelResponse)]
    assert [r.model_name for r in responses] == ["model-x"] * 3 + ["model-y"] * (TURNS + 1 - 3)
    assert [(line["model"], line["after"]) for line in _kinds(counts, "model")] == [
        *(("model-x", n) for n in range(3)),
        *(("model-y", n) for n in range(3, TURNS + 1)),
    ]
    assert [line["item"] for line in _kinds(counts, "tool")] == list(range(TURNS))
    ledger = open_ledger(store_url)
    try:
        state = ledger.state(RUN)
    finally:
        ledger.close()
    assert (state.usage.fuel, state.usage.cost_micros) == _usage_of(responses)
    assert state.usage.calls == 2 * TURNS + 1
    assert state.status == "completed"
    grants = [e.body.placement for e in _history(store_url) if isinstance(e.body, LeaseGranted)]
    assert [(p.worker, p.model) for p in grants] == [("alice", "model-x"), ("bob", "model-y")]


def test_two_processes_on_one_run_cannot_both_make_progress(store_url: str, tmp_path: Path) -> None:
    """Given worker A inside a model request of the run, when B starts the same run, then B is refused
    (lease_held); once A's lease expired and B took the run on, A's answer is refused (stale_epoch)
    and nothing A did after B's grant is on the log."""
    init_store(store_url)
    counts, clock = tmp_path / "counts.jsonl", ManualClock()
    inside, go_on = asyncio.Event(), asyncio.Event()

    async def hold_second(request: int) -> None:
        if request == 2:
            inside.set()
            await go_on.wait()

    def agent_worker(name: str, model: str, **kwargs: Any) -> BatonAgent:
        w = worker(store_url, name, model, clock=clock, ttl_ms=60_000, liveness=False)
        return BatonAgent(build_agent(counts, model, **kwargs), w, prices=PRICES)

    a = agent_worker("worker-a", "model-x", pause=hold_second)
    b = agent_worker("worker-b", "model-y")

    async def scenario() -> None:
        a_run = asyncio.create_task(a.run("count the stock", run_id=RUN))
        await inside.wait()
        with pytest.raises(errors.LeaseHeld):
            await b.run("count the stock", run_id=RUN)
        clock.advance(ms=60_001)
        with pytest.raises(UsageLimitExceeded):
            await b.run("count the stock", run_id=RUN, usage_limits=UsageLimits(request_limit=3))
        go_on.set()
        with pytest.raises(errors.StaleEpoch):
            await a_run

    asyncio.run(scenario())
    a.worker.close()
    b.worker.close()
    events = _history(store_url)
    b_granted = next(i for i, e in enumerate(events) if isinstance(e.body, LeaseGranted) and e.worker == "worker-b")
    assert {e.worker for e in events[b_granted:]} == {"worker-b"}
    assert [line["item"] for line in _kinds(counts, "tool")] == [0, 1, 2]


def test_the_ledger_enforces_a_cost_ceiling_and_the_run_fails_budget_exceeded(store_url: str, tmp_path: Path) -> None:
    """Given a run whose cost ceiling model Y passes on its 3rd answer, when it runs, then the answer
    that would pass it is refused whole, the run is failed budget_exceeded and no later tool runs."""
    init_store(store_url)
    counts = tmp_path / "counts.jsonl"
    durable = BatonAgent(
        build_agent(counts, "model-y"),
        worker(store_url, "alice", "model-y"),
        prices=PRICES,
        ceilings=Ceilings(cost_micros=3_000),
    )
    with pytest.raises(errors.BudgetExceeded):
        asyncio.run(durable.run("count the stock", run_id=RUN))
    state = durable.worker.reader.state(RUN)
    assert state.status == "failed"
    assert 0 < state.usage.cost_micros <= 3_000
    assert len(_kinds(counts, "tool")) == len(_kinds(counts, "model")) - 1


def test_a_resume_that_asks_something_else_diverges_and_stores_nothing(store_url: str, tmp_path: Path) -> None:
    """Given a run recorded for one prompt, when it is resumed with another, then ReplayDivergence
    names the position, and no intent is added."""
    init_store(store_url)
    counts = tmp_path / "counts.jsonl"
    durable = BatonAgent(build_agent(counts, "model-x"), worker(store_url, "alice", "model-x"), prices=PRICES)
    with pytest.raises(UsageLimitExceeded):
        asyncio.run(durable.run("count the stock", run_id=RUN, usage_limits=UsageLimits(request_limit=2)))
    intents = sum(isinstance(e.body, IntentRecorded) for e in _history(store_url))
    with pytest.raises(errors.ReplayDivergence) as diverged:
        asyncio.run(durable.run("count the stock twice", run_id=RUN))
    assert diverged.value.fields == ("context.arguments",)
    assert sum(isinstance(e.body, IntentRecorded) for e in _history(store_url)) == intents
    assert len(_kinds(counts, "model")) == 2


def test_in_a_signed_store_the_agent_signs_and_an_unkeyed_worker_is_refused(store_url: str, tmp_path: Path) -> None:
    """Given a store that verifies identities, when the agent's worker has its principal's key, then
    every event of the run is signed; the same worker without the key is refused signature_required."""
    operator, key = SigningKey.generate(), SigningKey.generate()
    init_store(store_url, operator_key=operator)
    assert register(store_url, operator, AddPrincipal("alice", ("worker",), key.public_key)).verdict == "accepted"
    counts = tmp_path / "counts.jsonl"
    unkeyed = BatonAgent(build_agent(counts, "model-x"), worker(store_url, "alice", "model-x"))
    with pytest.raises(errors.SignatureRequired):
        asyncio.run(unkeyed.run("count the stock", run_id=RUN))
    signed = BatonAgent(build_agent(counts, "model-x"), worker(store_url, "alice", "model-x", key=key))
    assert asyncio.run(signed.run("count the stock", run_id=RUN)).output == f"looked up {TURNS} items"
    signed.worker.close()
    events = _history(store_url)
    assert events and all(e.signature for e in events)
