"""Given a recorded history, when a worker resumes, then the replay prefix and cursor behave exactly.

Histories are built through the real ``decide -> seal -> apply`` path (``given.py``). The resuming
worker is modelled by ``resume``: it regenerates its intents in order, takes each recorded outcome
from the cursor, and calls the (fake) host only when the cursor says the operation is new.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import pytest

from baton.domain import errors
from baton.domain.commands import ReconcileIntent, RecordIntent, ReserveStage, SealCheckpoint
from baton.domain.decide import context_digest
from baton.domain.events import IntentContext
from baton.projections.replay import (
    ReplayCursor,
    ReplayDivergence,
    ReplayFold,
    ReplayIncomplete,
    ReplayPrefix,
    ReplayStep,
    StageReservation,
    prefix_steps,
    replay_prefix,
)

from ..domain.given import W1, W2, History, context, given, intent, observation, seconds


class RecordingHost:
    """A fake outside world that records every call it gets (the same shape as a tool host)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def call(self, op_id: str, context: IntentContext) -> dict[str, Any]:
        self.calls.append(op_id)
        return {"fresh": op_id}


def resume(cursor: ReplayCursor, host: RecordingHost, intents: Sequence[RecordIntent]) -> list[Any]:
    """What a resuming worker does: replay recorded outcomes, call the host only for new operations."""
    results: list[Any] = []
    for regenerated in intents:
        step = cursor.offer(regenerated.op_id, regenerated.kind, regenerated.tool_contract, regenerated.context)
        results.append(host.call(regenerated.op_id, regenerated.context) if step is None else step.result)
    return results


def settled(history: History, op_id: str, result: Any = None, arguments: dict[str, Any] | None = None) -> History:
    """Record ``op_id``'s intent and its ``ok`` observation (carrying ``result``)."""
    history.record(intent(op_id, arguments=arguments))
    history.record(observation(op_id, context_digest(context(op_id, arguments)), result=result))
    return history


def ops(steps: Sequence[ReplayStep]) -> list[str]:
    return [step.op_id for step in steps]


# -- the prefix -----------------------------------------------------------------------------------


def test_prefix_of_an_empty_or_effect_free_run_is_empty() -> None:
    """A run with no intents has an empty prefix and nothing uncertain."""
    assert replay_prefix([]) == ReplayPrefix((), ())
    assert replay_prefix(given().opened().leased(W1).log) == ReplayPrefix((), ())


def test_prefix_lists_settled_operations_in_intent_order_not_outcome_order() -> None:
    """Two intents observed in reverse order still replay in the order they were intended."""
    history = given().opened().leased(W1).intended("op-a").intended("op-b", alongside=True)
    history.observed("op-b").observed("op-a")

    prefix = replay_prefix(history.log)

    assert ops(prefix.steps) == ["op-a", "op-b"]
    assert [(s.intent_position, s.outcome_position) for s in prefix.steps] == [(3, 6), (4, 5)]
    assert prefix.uncertain == ()


def test_prefix_ends_at_the_first_uncertain_intent_even_if_later_ones_are_settled() -> None:
    """Settled operations after the first uncertain intent are not part of the prefix."""
    history = settled(given().opened().leased(W1), "op-1").intended("op-2")
    history.intended("op-3", alongside=True).observed("op-3")

    prefix = replay_prefix(history.log)

    assert ops(prefix.steps) == ["op-1"]
    assert ops(prefix.uncertain) == ["op-2"]


def test_every_uncertain_intent_is_listed_in_intent_order_with_its_position_and_kind() -> None:
    """Effect and pure intents without an outcome are all listed, in intent order."""
    history = given().opened().leased(W1).intended("op-1", "pure").intended("op-2", alongside=True).observed("op-2")
    history.intended("op-3", alongside=True)

    prefix = replay_prefix(history.log)

    assert prefix.steps == ()
    assert [(s.op_id, s.kind, s.intent_position, s.outcome) for s in prefix.uncertain] == [
        ("op-1", "pure", 3, None),
        ("op-3", "effect", 6, None),
    ]


def test_failed_observation_is_a_settled_step_carrying_its_failure_reason() -> None:
    """A failed outcome is still a recorded outcome: it is replayed, not redone."""
    history = given().opened().leased(W1).intended("op-1")
    history.record(observation("op-1", outcome="failed", failure_reason="timeout"))

    (step,) = replay_prefix(history.log).steps

    assert (step.op_id, step.outcome, step.failure_reason, step.outcome_position) == ("op-1", "failed", "timeout", 4)


@pytest.mark.parametrize("resolution", ["applied", "not_applied", "abandoned"])
def test_reconciled_operation_counts_as_settled(resolution: Literal["applied", "not_applied", "abandoned"]) -> None:
    """An intent lost by a dead worker and reconciled by its successor joins the prefix with that resolution."""
    history = settled(given().opened().leased(W1), "op-1").intended("op-2").advance(seconds(31)).leased(W2)
    result = {"rows": 3} if resolution == "applied" else None
    history.record(ReconcileIntent("op-2", resolution, "host log line 7", result=result), worker=W2)

    prefix = replay_prefix(history.log)

    assert ops(prefix.steps) == ["op-1", "op-2"]
    assert (prefix.steps[1].outcome, prefix.steps[1].result) == (resolution, result)
    assert prefix.uncertain == ()


# -- the cursor -----------------------------------------------------------------------------------


def test_cursor_returns_recorded_outcomes_on_exact_match_without_calling_the_host() -> None:
    """Regenerating the recorded intents exactly yields their recorded results; the host is never called."""
    history = settled(given().opened().leased(W1), "op-1", result={"rows": [1, 2]})
    settled(history, "op-2", result="patched", arguments={"path": "/srv/app.py"})
    cursor, host = ReplayCursor(replay_prefix(history.log)), RecordingHost()

    results = resume(cursor, host, [intent("op-1"), intent("op-2", arguments={"path": "/srv/app.py"})])

    assert results == [{"rows": [1, 2]}, "patched"]
    assert host.calls == []
    assert cursor.consumed


def test_cursor_hands_back_the_whole_recorded_step() -> None:
    """The step returned is the recorded one: outcome, positions and result, not a regenerated copy."""
    history = settled(given().opened().leased(W1), "op-1", result={"rows": 3})
    (recorded,) = replay_prefix(history.log).steps

    step = ReplayCursor(replay_prefix(history.log)).offer("op-1", "effect", "shell@1", context("op-1"))

    assert step == recorded
    assert (step.outcome, step.intent_position, step.outcome_position, step.result) == ("ok", 3, 4, {"rows": 3})


@pytest.mark.parametrize(
    ("regenerated", "fields"),
    [
        (intent("op-2", arguments={"k": "other"}), ("context.arguments",)),
        (intent("op-2", arguments={"k": "v", "extra": 1}), ("context.arguments",)),
        (RecordIntent("op-2", "effect", "shell@2", context("op-2"), "idem-op-2"), ("tool_contract",)),
        (intent("op-2", "pure"), ("kind",)),
        (RecordIntent("op-2", "effect", "shell@1", context("op-2", turn=2), "idem-op-2"), ("context.turn",)),
        (intent("op-9"), ("op_id", "context.operation")),
    ],
    ids=["arguments", "argument_added", "tool_contract", "kind", "turn", "op_id"],
)
def test_cursor_divergence_names_the_intent_position_and_the_differing_fields(
    regenerated: RecordIntent, fields: tuple[str, ...]
) -> None:
    """A regenerated intent that differs from the record raises ReplayDivergence at that intent's position."""
    history = settled(settled(given().opened().leased(W1), "op-1"), "op-2")
    cursor, host = ReplayCursor(replay_prefix(history.log)), RecordingHost()

    with pytest.raises(ReplayDivergence) as caught:
        resume(cursor, host, [intent("op-1"), regenerated])

    assert (caught.value.reason, caught.value.position, caught.value.fields) == ("replay_divergence", 5, fields)
    assert "position 5" in caught.value.message
    assert host.calls == []


def test_cursor_divergence_on_a_value_equal_in_python_but_not_in_bytes_names_the_context() -> None:
    """``True == 1`` in Python, but not in the canonical bytes: the divergence still fires, naming the context."""
    history = settled(given().opened().leased(W1), "op-1", arguments={"flag": 1})

    with pytest.raises(ReplayDivergence) as caught:
        ReplayCursor(replay_prefix(history.log)).offer("op-1", "effect", "shell@1", context("op-1", {"flag": True}))

    assert (caught.value.position, caught.value.fields) == (3, ("context",))


def test_cursor_refuses_new_effects_before_the_prefix_is_consumed() -> None:
    """Asking to call the host with recorded operations still to replay is replay_incomplete."""
    history = settled(settled(given().opened().leased(W1), "op-1"), "op-2")
    cursor = ReplayCursor(replay_prefix(history.log))
    cursor.offer("op-1", "effect", "shell@1", context("op-1"))

    with pytest.raises(ReplayIncomplete) as caught:
        cursor.require_new_effects_allowed()

    assert caught.value.reason == "replay_incomplete"
    assert not cursor.consumed


def test_cursor_refuses_new_operations_after_the_prefix_while_an_intent_is_uncertain() -> None:
    """Once the prefix is consumed, an uncertain intent still blocks every new operation (uncertain_intent)."""
    history = settled(given().opened().leased(W1), "op-1").intended("op-2")
    cursor, host = ReplayCursor(replay_prefix(history.log)), RecordingHost()

    with pytest.raises(errors.UncertainIntent) as caught:
        resume(cursor, host, [intent("op-1"), intent("op-3")])

    assert caught.value.reason == "uncertain_intent"
    assert "'op-2'" in caught.value.message and "position 5" in caught.value.message
    assert host.calls == []
    with pytest.raises(errors.UncertainIntent):
        cursor.require_new_effects_allowed()


def test_cursor_refuses_to_resend_the_uncertain_intent_itself() -> None:
    """Regenerating the uncertain intent is refused too: Baton never silently re-sends it."""
    history = given().opened().leased(W1).intended("op-1")
    cursor, host = ReplayCursor(replay_prefix(history.log)), RecordingHost()

    with pytest.raises(errors.UncertainIntent):
        resume(cursor, host, [intent("op-1")])

    assert host.calls == []


def test_cursor_returns_none_for_new_operations_once_consumed_and_nothing_is_uncertain() -> None:
    """After the prefix, with nothing uncertain, every new operation goes to the host exactly once."""
    history = settled(given().opened().leased(W1), "op-1", result="old")
    cursor, host = ReplayCursor(replay_prefix(history.log)), RecordingHost()

    results = resume(cursor, host, [intent("op-1"), intent("op-2"), intent("op-3")])

    assert results == ["old", {"fresh": "op-2"}, {"fresh": "op-3"}]
    assert host.calls == ["op-2", "op-3"]
    cursor.require_new_effects_allowed()


def test_cursor_over_an_empty_prefix_allows_new_operations_at_once() -> None:
    """A run with nothing recorded replays nothing: the first operation is new."""
    cursor = ReplayCursor(replay_prefix(given().opened().leased(W1).log))

    assert cursor.consumed
    assert cursor.offer("op-1", "effect", "shell@1", context("op-1")) is None


def test_cursor_replays_a_reconciled_operation_instead_of_resending_it() -> None:
    """An effect reconciled as applied is replayed with the reconciled result; the host is not called for it."""
    history = given().opened().leased(W1).intended("op-1").advance(seconds(31)).leased(W2)
    history.record(ReconcileIntent("op-1", "applied", "host log line 7", result={"rows": 3}), worker=W2)
    cursor, host = ReplayCursor(replay_prefix(history.log)), RecordingHost()

    assert resume(cursor, host, [intent("op-1"), intent("op-2")]) == [{"rows": 3}, {"fresh": "op-2"}]
    assert host.calls == ["op-2"]


# -- checkpoints and stage reservations -----------------------------------------------------------


def test_prefix_starts_after_the_last_sealed_checkpoint() -> None:
    """Operations before a sealed checkpoint are part of its task state: only later ones are replayed."""
    history = settled(given().opened().leased(W1), "op-1")
    history.record(SealCheckpoint("ckpt-1", "sha256:state-1"))
    sealed_at = history.state.version
    settled(history, "op-2")

    prefix = replay_prefix(history.log)

    assert (prefix.start, ops(prefix.steps)) == (sealed_at, ["op-2"])


def test_replayed_stage_must_be_reserved_again_before_its_operation() -> None:
    """A recorded stage reservation is charged again on replay: the cursor refuses the step until it is."""
    history = given().opened().leased(W1)
    history.record(ReserveStage("plan", 5))
    settled(history, "op-1", result="planned")
    cursor = ReplayCursor(replay_prefix(history.log))

    assert cursor.next_reservations() == (StageReservation("plan", 5),)
    with pytest.raises(ReplayIncomplete, match="reserve again: plan"):
        cursor.offer("op-1", "effect", "shell@1", context("op-1"))
    history.record(ReserveStage("plan", 5))  # the resuming worker reserves the stage's fuel again
    cursor.reserved("plan", 5)

    step = cursor.offer("op-1", "effect", "shell@1", context("op-1"))
    assert step is not None and step.result == "planned"
    assert history.state.usage.reserved_fuel == 10  # never refunded: both reservations count


def test_replay_reserving_other_fuel_than_recorded_diverges() -> None:
    """Reserving a stage with different fuel than the record is a divergence naming the reservations."""
    history = given().opened().leased(W1)
    history.record(ReserveStage("plan", 5))
    settled(history, "op-1")
    cursor = ReplayCursor(replay_prefix(history.log))
    cursor.reserved("plan", 4)

    with pytest.raises(ReplayDivergence) as caught:
        cursor.offer("op-1", "effect", "shell@1", context("op-1"))

    assert (caught.value.position, caught.value.fields) == (4, ("stage_reservations",))


def test_streamed_cursor_over_an_outline_replays_like_the_materialised_prefix() -> None:
    """A cursor fed one step at a time from the log behaves like one over the whole prefix."""
    history = settled(settled(given().opened().leased(W1), "op-1", result=1), "op-2", result=2)
    fold = ReplayFold()
    for event in history.log:
        fold.apply(event)
    outline = fold.outline()
    cursor = ReplayCursor(outline, prefix_steps((e for e in history.log if e.position > outline.start), outline.length))

    results = resume(cursor, RecordingHost(), [intent("op-1"), intent("op-2")])

    assert (outline.length, results, cursor.consumed) == (2, [1, 2], True)
