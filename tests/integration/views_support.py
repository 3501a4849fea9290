"""Histories, readers and the spawned processes of the view tests.

A plain module (not a conftest) so that ``spawn`` children can import the process functions by
name. ``expected_views`` is the reference: the pure folds (``summarize``/``classify`` and
``budget_usage``) over the whole log, computed without any of the view code.
"""

from __future__ import annotations

import datetime as dt
import os
import random
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from integration_support import TASK, RawStore

from baton.adapters.bootstrap import open_ledger, open_views
from baton.adapters.clock import ManualClock
from baton.adapters.eventstore import RunLedger
from baton.domain.budgets import COUNTERS, Usage
from baton.domain.commands import (
    AcquireLease,
    CompleteRun,
    FailRun,
    OpenRun,
    ReconcileIntent,
    RecordIntent,
    RecordObservation,
    RecordTransition,
    ReleaseLease,
    RenewLease,
    Submission,
    Verdict,
)
from baton.domain.decide import context_digest
from baton.domain.events import IntentContext, Placement, RecordedEvent
from baton.domain.stages import Stage, is_legal
from baton.projections.budget_usage import budget_usage
from baton.projections.resumability import classify, summarize

__all__ = [
    "VIEW_RUNNER_APP",
    "RunWriter",
    "expected_views",
    "follow_views",
    "read_views",
    "write_runs",
]

VIEW_RUNNER_APP = "baton-view-runner"
T0 = 1_767_225_600_000_000
TTL_MS = 24 * 3600 * 1000  # the longest lease decide allows: clock steps stay inside it
PLACEMENTS = {
    "w-a": Placement("w-a", model="m-1", provider="p-1", capabilities=("gpu",), tool_contracts=("tool@1",)),
    "w-b": Placement("w-b", model="m-2", provider="p-1", tool_contracts=("tool@1", "http@2")),
    "w-c": Placement("w-c", model="m-2", provider="p-2", tool_contracts=("http@2",)),
}

RunRows = dict[str, tuple[Any, ...]]
BudgetRows = dict[tuple[str, str], tuple[int, ...]]


class RunWriter:
    """Drives one run through the real ledger with a seeded mix of commands; rejections are fine."""

    def __init__(self, ledger: RunLedger, clock: ManualClock, run_id: str, seed: int) -> None:
        self.ledger, self.clock, self.run_id = ledger, clock, run_id
        self.rng = random.Random(seed)
        self.worker, self.epoch, self.ops, self.sent = "", 0, 0, 0
        self.uncertain: dict[str, str] = {}  # op id -> context digest

    def submit(self, command: Any, worker: str | None = None) -> Verdict:
        self.sent += 1
        worker = worker or self.worker or "supervisor"
        sid = f"{self.run_id}-{self.sent}"
        verdict = self.ledger.submit(Submission(sid, self.run_id, worker, command, self.epoch))
        if verdict.reason == "lease_expired":  # the clock outran the lease: someone acquires it anew
            self.take_over(self.rng.choice(sorted(PLACEMENTS)), expired=True)
        return verdict

    def open(self) -> None:
        self.submit(OpenRun("rel-1", "agent-state", 1, TASK), "supervisor")
        self.take_over(self.rng.choice(sorted(PLACEMENTS)))

    def take_over(self, worker: str, *, expired: bool = False) -> None:
        """Release (or let expire) the current lease and hand the run to ``worker``."""
        if expired:
            pass
        elif self.worker and self.rng.random() < 0.5:
            self.submit(ReleaseLease())
        elif self.worker:
            self.clock.advance(ms=TTL_MS + 1)  # the old lease expires; AcquireLease records it
        self.worker = worker
        if self.submit(AcquireLease(PLACEMENTS[worker], ttl_ms=TTL_MS), worker).verdict == "accepted":
            self.epoch = self.ledger.state(self.run_id).epoch
        for op_id in sorted(self.uncertain):  # a new owner reconciles what it inherited
            self.submit(ReconcileIntent(op_id, self.rng.choice(["applied", "not_applied"]), "host log"))
        self.uncertain.clear()

    def step(self) -> None:
        rng = self.rng
        self.clock.advance(seconds=rng.choice([1, 5, 600, 3 * 3600]))  # crosses days now and then
        roll = rng.random()
        if roll < 0.04:
            self.take_over(rng.choice(sorted(PLACEMENTS)))
        elif roll < 0.08:
            self.submit(RenewLease(ttl_ms=TTL_MS))
        elif roll < 0.18:
            state = self.ledger.state(self.run_id)
            legal = [stage for stage in Stage if is_legal(state.stage, stage)]
            if legal:
                self.submit(RecordTransition(rng.choice(legal), f"sha256:s{state.version}"))
        elif self.uncertain and roll < 0.55:
            op_id = rng.choice(sorted(self.uncertain))
            digest = self.uncertain.pop(op_id)
            usage = Usage(fuel=rng.randrange(50), cost_micros=rng.randrange(1000))
            result = {"rows": list(range(rng.randrange(5)))}
            outcome = rng.choice(["ok", "ok", "failed"])
            reason = "timeout" if outcome == "failed" else None
            self.submit(RecordObservation(op_id, digest, outcome, reason, result, None, usage))
        else:
            self.ops += 1
            op_id = f"op-{self.ops}"
            context = IntentContext(1, op_id, effect="write", arguments={"n": rng.randrange(10 ** rng.randrange(1, 6))})
            tool = rng.choice(PLACEMENTS[self.worker].tool_contracts)
            kind = rng.choice(["effect", "pure"])
            if self.submit(RecordIntent(op_id, kind, tool, context, f"idem-{op_id}")).verdict == "accepted":
                self.uncertain[op_id] = context_digest(context)

    def finish(self) -> None:
        """End the run one of four ways, so every resumability class family shows up."""
        ending = self.rng.randrange(4)
        if ending == 0:
            self.submit(FailRun("gave_up"))
        elif ending == 1:
            for op_id in sorted(self.uncertain):
                self.submit(ReconcileIntent(op_id, "abandoned", "closing"))
            self.submit(CompleteRun("done"))
        elif ending == 2:
            self.submit(ReleaseLease())
        # ending 3: left open, possibly with uncertain effects


def write_runs(url: str, run_ids: list[str], steps: int, seed: int, stop: Any = None, started: Any = None) -> None:
    """Interleave ``steps`` steps over ``run_ids`` (until ``stop`` is set, if given), then finish each run."""
    clock = ManualClock(T0 + seed * 1_000_000)
    ledger = open_ledger(url, clock=clock)
    try:
        writers = [RunWriter(ledger, clock, run_id, seed * 1000 + i) for i, run_id in enumerate(run_ids)]
        for writer in writers:
            writer.open()
        if started is not None:
            started.set()
        for i in range(steps):
            if stop is not None and stop.is_set() and i > 0:
                break
            writers[i % len(writers)].step()
        for writer in writers:
            writer.finish()
    finally:
        ledger.close()


def follow_views(url: str, stop: Any, batch_size: int) -> None:
    """A view runner process: poll and apply until ``stop`` is set, then drain and exit."""
    os.environ["PGAPPNAME"] = VIEW_RUNNER_APP  # lets the test find this process's sessions
    with open_views(url, batch_size=batch_size) as runner:
        runner.follow(stop, interval=0.02)


# -- the reference and the readers ----------------------------------------------------------------


def expected_views(events: Iterable[RecordedEvent]) -> tuple[RunRows, BudgetRows]:
    """``run_state`` and ``budget_usage`` as the pure folds define them, from the whole log."""
    events = list(events)
    by_run: dict[str, list[RecordedEvent]] = defaultdict(list)
    for event in events:
        by_run[event.run_id].append(event)
    runs: RunRows = {}
    for run_id, history in by_run.items():
        summary = summarize(history, run_id)
        now = history[-1].recorded_at
        verdict = classify(summary, summary.placement or Placement(worker=""), now)
        state = summary.state
        runs[run_id] = (state.version, str(state.stage), state.status, state.epoch, state.holder, str(verdict.cls), now)
    usage = budget_usage(events).rows
    return runs, {row: tuple(getattr(value, name) for name in COUNTERS) for row, value in usage.items()}


def _micros(value: Any) -> int:
    if isinstance(value, str):  # SQLite: ISO 8601 text
        value = dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=dt.UTC)
    delta = value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def read_views(store: RawStore, suffix: str = "") -> tuple[RunRows, BudgetRows]:
    """The view tables as the reference's dictionaries (``updated_at`` back to microseconds)."""
    runs = {
        row[0]: (*row[1:6], row[6], _micros(row[7]))
        for row in store.query(
            "SELECT run_id, position, stage, status, epoch, owner, resumability_class, updated_at "
            f"FROM run_state{suffix}"
        )
    }
    budget = {
        (row[0], row[1]): tuple(row[2:])
        for row in store.query(f"SELECT dimension, key, {', '.join(COUNTERS)} FROM budget_usage{suffix}")
    }
    return runs, budget


def tracking(store: RawStore) -> dict[str, int]:
    table = "tracking" if store.backend == "sqlite" else "batonviews_tracking"
    return {row[0]: row[1] for row in store.query(f"SELECT application_name, notification_id FROM {table}")}
