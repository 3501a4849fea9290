"""Given a recorded history and a proposed target, when classified, then this class with these reasons.

One test per class (R0..R5, MIGRATION_UNSAFE), each on a real history (``scenarios.py``, the same
histories docs/resumability.md prints), then the precedence between classes. Reasons are asserted
on the concrete facts they must name (op id, position, tool contract, capability, epoch).
"""

from __future__ import annotations

import copy

import msgspec
import pytest

from baton.domain.commands import AcquireLease, ExpireLease, FailRun, ReleaseLease
from baton.domain.events import Placement
from baton.projections.portable_state import PortableStateFold
from baton.projections.resumability import Resumability, ResumabilityClass, classify, summarize, summary_of

from ..domain.given import RUN, W1, W2, History, given, placement, seconds
from .scenarios import GPU, SCENARIOS, gpu_placement, verdict

R0, R1, R2, R3, R4, R5 = (ResumabilityClass(f"R{n}") for n in range(6))
UNSAFE = ResumabilityClass.MIGRATION_UNSAFE
BARE = Placement(W2)  # honours no tool contract and no capability


def judged(history: History, target: Placement) -> Resumability:
    return classify(summarize(history.log, RUN), target, history.now)


# -- one class each -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("R0-completed", "the run is completed: nothing to resume"),
        ("R0-failed", "the run is failed: nothing to resume"),
        ("R0-missing", "the run does not exist"),
    ],
)
def test_r0_terminal_or_nonexistent_run_is_not_resumable(key: str, reason: str) -> None:
    """A completed or failed run, or one never opened, is R0 with the one reason that says why."""
    assert verdict(SCENARIOS[key]()) == Resumability(R0, (reason,))


def test_r1_uncertain_pure_intent_is_restarted_from_the_last_boundary() -> None:
    """A pure intent without an outcome is R1: its work is redone; the reason names the op and position."""
    result = verdict(SCENARIOS["R1"]())

    assert result.cls is R1
    assert len(result.reasons) == 1
    assert "pure operation 'op-1' (position 3)" in result.reasons[0]


def test_r2_holder_resuming_its_own_live_lease_with_nothing_recorded() -> None:
    """The live lease's holder, with no operations at all, resumes from deterministic state."""
    assert verdict(SCENARIOS["R2"]()) == Resumability(R2, ("deterministic state at GENERATING: nothing to replay",))


def test_r3_recorded_outcomes_are_replayed() -> None:
    """Settled operations make R3; the reason counts the outcomes the cursor will hand back."""
    assert verdict(SCENARIOS["R3"]()) == Resumability(
        R3, ("2 recorded outcomes are replayed without calling the host",)
    )


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("R4-held", "lease epoch 1 is held by 'worker-a' until 2023-11-14T22:13:50Z: the epoch must advance"),
        ("R4-expired", "lease epoch 1 is expired: the epoch must advance"),
        ("R4-released", "no live lease (last epoch 1): acquire epoch 2"),
    ],
)
def test_r4_ownership_must_transfer(key: str, reason: str) -> None:
    """A lease held by another worker, expired by the store clock, or released: the epoch must advance."""
    assert verdict(SCENARIOS[key]()) == Resumability(R4, (reason,))


def test_r4_lease_expired_by_a_recorded_expiry_names_the_next_epoch() -> None:
    """After a recorded LeaseExpired the run has no lease; the reason names the epoch to acquire."""
    history = given().opened().leased(W1).advance(seconds(31))
    history.record(ExpireLease(), worker=W2)

    assert judged(history, placement(W1)) == Resumability(R4, ("no live lease (last epoch 1): acquire epoch 2",))


def test_r5_effect_whose_observation_was_lost() -> None:
    """An effect without an outcome is R5, even for its live holder; the reason names op, position, contract."""
    history = given().opened().leased(W1).intended("op-1")

    result = judged(history, placement(W1))

    assert result.cls is R5
    assert result.reasons == (
        "effect 'op-1' (position 3, shell@1) has no recorded outcome: reconcile it before any new effect",
    )


def test_r5_lists_every_uncertain_effect() -> None:
    """Each uncertain effect gets its own reason, in intent order."""
    history = given().opened().leased(W1).intended("op-1").intended("op-2", alongside=True)

    result = judged(history, placement(W1))

    assert result.cls is R5
    assert [r.split(" (")[0] for r in result.reasons] == ["effect 'op-1'", "effect 'op-2'"]


def test_reconciling_the_lost_effect_drops_r5_to_r3() -> None:
    """Once the uncertain effect is reconciled it is a recorded outcome: R3, with both outcomes to replay."""
    assert verdict(SCENARIOS["R3-reconciled"]()) == Resumability(
        R3, ("2 recorded outcomes are replayed without calling the host",)
    )


def test_migration_unsafe_when_the_target_lacks_a_tool_contract_the_run_used() -> None:
    """A tool contract used by any intent but absent on the target (even another version) is unsafe."""
    assert verdict(SCENARIOS["MIGRATION_UNSAFE-contract"]()) == Resumability(
        UNSAFE, ("target lacks tool contracts the run used: shell@1",)
    )


def test_migration_unsafe_when_the_target_lacks_a_capability_of_the_last_placement() -> None:
    """A capability of the last lease's placement that the target does not declare is unsafe."""
    assert verdict(SCENARIOS["MIGRATION_UNSAFE-capability"]()) == Resumability(
        UNSAFE, (f"target lacks capabilities of the last placement: {GPU}",)
    )


def test_migration_unsafe_names_every_missing_contract_and_capability() -> None:
    """Both rules report, contracts first, each listing what is missing in sorted order."""
    history = given().opened()
    history.record(AcquireLease(gpu_placement(W1)), worker=W1)
    history.intended("op-1")

    assert judged(history, BARE) == Resumability(
        UNSAFE,
        (
            "target lacks tool contracts the run used: shell@1",
            f"target lacks capabilities of the last placement: {GPU}",
        ),
    )


def test_migration_unsafe_capability_is_still_judged_when_the_lease_merely_timed_out() -> None:
    """A lease past its expiry but not yet recorded as expired still carries the placement's capabilities."""
    history = given().opened()
    history.record(AcquireLease(gpu_placement(W1)), worker=W1)
    history.advance(seconds(31))

    assert judged(history, placement(W2)).cls is UNSAFE


@pytest.mark.parametrize("ending", ["released", "expired"])
def test_migration_unsafe_capability_survives_the_end_of_the_lease(ending: str) -> None:
    """The run still needs its capability after its lease ended: a target without it stays unsafe."""
    history = given().opened()
    history.record(AcquireLease(gpu_placement(W1)), worker=W1)
    if ending == "released":
        history.record(ReleaseLease(), worker=W1)
    else:
        history.advance(seconds(31)).record(ExpireLease(), worker=W2)

    assert judged(history, placement(W2)).cls is UNSAFE


# -- precedence -----------------------------------------------------------------------------------


def test_r0_beats_everything() -> None:
    """A failed run with an uncertain effect, judged for a target lacking everything, is still just R0."""
    history = given().opened()
    history.record(AcquireLease(gpu_placement(W1)), worker=W1)
    history.intended("op-1").record(FailRun("gave_up"))

    assert judged(history, BARE) == Resumability(R0, ("the run is failed: nothing to resume",))
    assert judged(given(), BARE) == Resumability(R0, ("the run does not exist",))


def test_migration_unsafe_beats_r5_and_r4() -> None:
    """An uncertain effect on an expired lease, for a target lacking its contract, is MIGRATION_UNSAFE."""
    history = given().opened().leased(W1).intended("op-1").advance(seconds(31))

    result = judged(history, BARE)

    assert result.cls is UNSAFE
    assert result.reasons[0] == "target lacks tool contracts the run used: shell@1"


def test_r5_beats_r4_beats_r3_and_every_reason_is_kept() -> None:
    """A lost effect after a settled one, on an expired lease: R5, with the R4 and R3 reasons after it."""
    result = verdict(SCENARIOS["R5"]())

    assert result == Resumability(
        R5,
        (
            "effect 'op-2' (position 5, shell@1) has no recorded outcome: reconcile it before any new effect",
            "lease epoch 1 is expired: the epoch must advance",
            "1 recorded outcomes are replayed without calling the host",
        ),
    )


def test_r4_beats_r3() -> None:
    """Recorded outcomes on a lease held by someone else: R4, keeping the R3 reason."""
    history = given().opened().leased(W1).intended("op-1").observed("op-1")

    assert judged(history, placement(W2)) == Resumability(
        R4,
        (
            "lease epoch 1 is held by 'worker-a' until 2023-11-14T22:13:50Z: the epoch must advance",
            "1 recorded outcomes are replayed without calling the host",
        ),
    )


def test_r3_beats_r1() -> None:
    """A settled operation before an uncertain pure one: R3, with the R1 reason naming the pure op."""
    history = given().opened().leased(W1).intended("op-1").observed("op-1").intended("op-2", "pure")

    result = judged(history, placement(W1))

    assert result.cls is R3
    assert result.reasons[0] == "1 recorded outcomes are replayed without calling the host"
    assert "pure operation 'op-2' (position 5)" in result.reasons[1]


def test_r5_beats_r1_when_effect_and_pure_intents_are_both_uncertain() -> None:
    """An uncertain effect outranks an uncertain pure intent; both are reported."""
    history = given().opened().leased(W1).intended("op-1", "pure").intended("op-2", alongside=True)

    result = judged(history, placement(W1))

    assert result.cls is R5
    assert result.reasons[0].startswith("effect 'op-2'")
    assert result.reasons[1].startswith("pure operation 'op-1'")


# -- the shape of the answer ----------------------------------------------------------------------


def test_verdict_encodes_as_class_and_reasons() -> None:
    """The JSON shape that `baton resume` prints is {"class": ..., "reasons": [...]}."""
    encoded = msgspec.json.encode(verdict(SCENARIOS["R4-released"]()))

    assert msgspec.json.decode(encoded) == {
        "class": "R4",
        "reasons": ["no live lease (last epoch 1): acquire epoch 2"],
    }


def test_summary_of_a_fold_does_not_change_when_the_fold_moves_on() -> None:
    """A summary taken at position n still describes position n after its fold applies more events."""
    history = given().opened().leased(W1).intended("op-1")
    fold = PortableStateFold(RUN)
    for event in history.log[:2]:
        fold.apply(event)
    summary = summary_of(fold)
    taken = copy.deepcopy(summary)

    for event in history.log[2:]:
        fold.apply(event)

    assert summary == taken


def test_classify_is_pure() -> None:
    """Classifying twice gives the same answer and leaves the summary untouched."""
    scenario = SCENARIOS["R5"]()
    summary = summarize(scenario.events)
    before = copy.deepcopy(summary)

    first = classify(summary, scenario.target, scenario.now)

    assert classify(summary, scenario.target, scenario.now) == first
    assert summary == before
