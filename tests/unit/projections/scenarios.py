"""One short, real history per resumability class: the tests assert on them, the doc prints them.

Every history is built through ``decide -> seal -> apply`` (``given.py``). ``render`` turns a
scenario into the Markdown that docs/resumability.md shows (event table, target, and the
``resumability`` object of ``baton resume --json``); ``test_resumability_doc`` checks that the doc
still says exactly that. Regenerate the doc's examples with
``python -m tests.unit.projections.scenarios`` from the repository root.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from baton.domain.commands import (
    AcquireLease,
    CompleteRun,
    FailRun,
    ReconcileIntent,
    ReleaseLease,
)
from baton.domain.events import (
    Event,
    IntentReconciled,
    IntentRecorded,
    LeaseExpired,
    LeaseGranted,
    LeaseReleased,
    ObservationRecorded,
    Placement,
    RecordedEvent,
    RunFailed,
    TransitionRecorded,
)
from baton.projections.resumability import Resumability, classify, summarize

from ..domain.given import T0, W1, W2, History, given, placement, seconds

__all__ = ["GPU", "SCENARIOS", "Scenario", "gpu_placement", "render", "verdict"]

GPU = "gpu:a100"


def gpu_placement(worker: str) -> Placement:
    """A placement that declares a capability, so a target without it is unsafe."""
    return Placement(worker, model="m-1", provider="p-1", region="eu", capabilities=(GPU,), tool_contracts=("shell@1",))


@dataclass(frozen=True)
class Scenario:
    """A history, a proposed target placement, and the store clock's reading at the question."""

    key: str
    title: str
    history: History
    target: Placement

    @property
    def events(self) -> list[RecordedEvent]:
        return self.history.log

    @property
    def now(self) -> int:
        return self.history.now


def verdict(scenario: Scenario) -> Resumability:
    return classify(summarize(scenario.events), scenario.target, scenario.now)


# -- the histories --------------------------------------------------------------------------------


def r0_completed() -> Scenario:
    history = given().opened().leased(W1).intended("op-1").observed("op-1")
    history.record(CompleteRun("done"))
    return Scenario("R0-completed", "R0: a completed run", history, placement(W2))


def r0_failed() -> Scenario:
    history = given().opened().leased(W1).intended("op-1")
    history.record(FailRun("gave_up"))
    return Scenario("R0-failed", "R0: a failed run (even with an uncertain effect)", history, placement(W2))


def r0_missing() -> Scenario:
    return Scenario("R0-missing", "R0: a run that does not exist", given(), placement(W1))


def r1_pure() -> Scenario:
    history = given().opened().leased(W1).intended("op-1", "pure")
    return Scenario("R1", "R1: an uncertain pure intent", history, placement(W1))


def r2_own_lease() -> Scenario:
    history = given().opened().leased(W1)
    return Scenario("R2", "R2: the holder resumes its own live lease, nothing recorded", history, placement(W1))


def r3_replay() -> Scenario:
    history = given().opened().leased(W1).intended("op-1").observed("op-1").intended("op-2").observed("op-2")
    return Scenario("R3", "R3: recorded outcomes to replay", history, placement(W1))


def r4_held() -> Scenario:
    history = given().opened().leased(W1)
    return Scenario("R4-held", "R4: the lease is held by another worker", history, placement(W2))


def r4_expired() -> Scenario:
    history = given().opened().leased(W1).advance(seconds(31))
    return Scenario("R4-expired", "R4: the lease expired (by the store clock)", history, placement(W1))


def r4_released() -> Scenario:
    history = given().opened().leased(W1)
    history.record(ReleaseLease())
    return Scenario("R4-released", "R4: the lease was released", history, placement(W2))


def r5_lost() -> Scenario:
    history = given().opened().leased(W1).intended("op-1").observed("op-1").intended("op-2").advance(seconds(31))
    return Scenario("R5", "R5: an effect whose observation was lost", history, placement(W2))


def r3_reconciled() -> Scenario:
    history = r5_lost().history.leased(W2)
    history.record(ReconcileIntent("op-2", "applied", "host log line 7", result={"rows": 3}), worker=W2)
    return Scenario("R3-reconciled", "R3 again: the lost effect reconciled as applied", history, placement(W2))


def unsafe_contract() -> Scenario:
    history = given().opened().leased(W1).intended("op-1").observed("op-1")
    target = Placement(W2, model="m-1", provider="p-1", region="eu", tool_contracts=("shell@2",))
    return Scenario("MIGRATION_UNSAFE-contract", "MIGRATION_UNSAFE: a missing tool contract", history, target)


def unsafe_capability() -> Scenario:
    history = given().opened()
    history.record(AcquireLease(gpu_placement(W1)), worker=W1)
    history.intended("op-1").observed("op-1").record(ReleaseLease())
    title = "MIGRATION_UNSAFE: a missing capability (of the last placement, after its lease ended)"
    return Scenario("MIGRATION_UNSAFE-capability", title, history, placement(W2))


BUILDERS: tuple[Callable[[], Scenario], ...] = (
    r0_completed,
    r0_failed,
    r0_missing,
    r1_pure,
    r2_own_lease,
    r3_replay,
    r4_held,
    r4_expired,
    r4_released,
    r5_lost,
    r3_reconciled,
    unsafe_contract,
    unsafe_capability,
)
SCENARIOS: dict[str, Callable[[], Scenario]] = {builder().key: builder for builder in BUILDERS}


# -- rendering ------------------------------------------------------------------------------------


def _describe(body: Event) -> str:  # noqa: PLR0911
    name = type(body).__name__
    if isinstance(body, LeaseGranted):
        capabilities = f"capabilities {', '.join(body.placement.capabilities)}; " if body.placement.capabilities else ""
        return f"{name} ({capabilities}expires T0+{(body.expires_at - T0) // seconds(1)} s)"
    if isinstance(body, IntentRecorded):
        return f"{name} `{body.op_id}` ({body.kind}, {body.tool_contract})"
    if isinstance(body, ObservationRecorded):
        return f"{name} `{body.op_id}` ({body.outcome})"
    if isinstance(body, IntentReconciled):
        return f"{name} `{body.op_id}` ({body.resolution})"
    if isinstance(body, TransitionRecorded):
        return f"{name} ({body.from_stage} -> {body.to_stage})"
    if isinstance(body, LeaseExpired | LeaseReleased):
        return f"{name} (epoch {body.epoch})"
    if isinstance(body, RunFailed):
        return f"{name} ({body.reason})"
    return name


def _target(target: Placement) -> str:
    capabilities = ", ".join(target.capabilities) or "none"
    contracts = ", ".join(target.tool_contracts) or "none"
    return f"`{target.worker}`, capabilities: {capabilities}, tool contracts: {contracts}"


def render(scenario: Scenario) -> str:
    """The Markdown block of one worked example."""
    lines = ["| position | event | worker | epoch |", "|---|---|---|---|"]
    lines += [f"| {e.position} | {_describe(e.body)} | `{e.worker}` | {e.epoch} |" for e in scenario.events]
    if not scenario.events:
        lines = ["(no events: the run was never opened)"]
    lines += [
        "",
        f"Target: {_target(scenario.target)}. Clock: T0+{(scenario.now - T0) // seconds(1)} s.",
        "",
        "```json",
        msgspec.json.encode(verdict(scenario)).decode(),
        "```",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    for build in BUILDERS:
        example = build()
        print(f"### {example.title}\n\n{render(example)}\n")
