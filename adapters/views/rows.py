"""One batch of events folded onto the stored per-run fold states: the view rows to write.

Pure (no I/O): the view stores load the states of the batch's runs, fold the batch here and write
what comes out, all in one transaction. Nothing here re-implements a projection:

* ``run_state`` comes from ``PortableStateFold`` (the same fold a resume uses), classified with
  ``projections.resumability.classify``;
* ``budget_usage`` deltas come from ``BudgetUsageFold``, seeded with each run's lease placement;
* the per-run state that carries both folds across batches is one msgpack value, ``RunViewState``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import msgspec

from baton.domain.budgets import COUNTERS, Usage
from baton.domain.errors import ChainBroken, StoreUnavailable
from baton.domain.events import Placement, RecordedEvent
from baton.projections.budget_usage import BudgetUsageFold, Dimension
from baton.projections.portable_state import PortableStateFold, ResumeState, fresh_resume_state
from baton.projections.resumability import Resumability, classify, summary_of

__all__ = [
    "BudgetRow",
    "RunStateRow",
    "RunViewState",
    "ViewBatch",
    "resumability",
]

NO_PLACEMENT = Placement(worker="")


def _decode(run_id: str, data: bytes) -> RunViewState:
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError:
        msg = f"view fold state of run {run_id!r} was written by an older build: run `baton views rebuild`"
        raise StoreUnavailable(msg) from None


class RunViewState(msgspec.Struct):
    """What ``view_run_fold.state`` holds for a run: everything needed to fold its next event."""

    resume: ResumeState
    budget_placement: Placement | None = None  # BudgetUsageFold's placement for the run
    updated_at: int = 0  # recorded_at of the run's latest event (microseconds)


# Deterministic: a set (the tool contracts in use) is written sorted, so a state rebuilt from the
# log is the same bytes as the one folded incrementally, whatever order the set was filled in.
_encoder = msgspec.msgpack.Encoder(order="deterministic")
_decoder = msgspec.msgpack.Decoder(RunViewState)


class RunStateRow(msgspec.Struct, frozen=True):
    """One ``run_state`` row; ``updated_at`` in microseconds since the epoch (the store's clock)."""

    run_id: str
    position: int
    stage: str
    status: str
    epoch: int
    owner: str | None
    resumability_class: str
    updated_at: int


class BudgetRow(msgspec.Struct, frozen=True):
    """One ``budget_usage`` delta: add ``usage`` to the row ``(dimension, key)``."""

    dimension: Dimension
    key: str
    usage: Usage

    def counters(self) -> tuple[int, ...]:
        return tuple(getattr(self.usage, name) for name in COUNTERS)


def resumability(fold: PortableStateFold, now: int) -> Resumability:
    """The view's definition: can the last lease's placement (same worker) resume the run at ``now``?

    ``now`` is the recorded time of the run's latest event, so the answer depends on the log only
    (a rebuild gives the same class). A run that never had a lease is judged against an empty
    placement (no worker, no capabilities, no tool contracts).
    """
    summary = summary_of(fold)
    return classify(summary, summary.placement or NO_PLACEMENT, now)


@dataclass
class _Run:
    fold: PortableStateFold
    updated_at: int
    events: int = 0


class ViewBatch:
    """Fold events (in notification order) onto the stored states of their runs.

    ``stored`` maps run id to the bytes of its ``RunViewState``; runs absent from it start empty.
    Each run's events must continue its stored position exactly: a gap or a repeat raises
    ``ChainBroken`` instead of folding a wrong view.
    """

    def __init__(self, stored: Mapping[str, bytes]) -> None:
        self._stored = stored
        self._runs: dict[str, _Run] = {}
        self._budget = BudgetUsageFold()
        self.events = 0

    def apply(self, event: RecordedEvent) -> None:
        run = self._run(event.run_id)
        expected = run.fold.run.version + 1
        if event.position != expected:
            msg = (
                f"run {event.run_id!r}: the view is at position {expected - 1} but the next event is at "
                f"{event.position} (an event was skipped or repeated)"
            )
            raise ChainBroken(msg, expected)
        run.fold.apply(event)
        run.updated_at = event.recorded_at
        run.events += 1
        self._budget.apply(event)
        self.events += 1

    def apply_all(self, events: Iterable[RecordedEvent]) -> ViewBatch:
        for event in events:
            self.apply(event)
        return self

    def _run(self, run_id: str) -> _Run:
        run = self._runs.get(run_id)
        if run is None:
            data = self._stored.get(run_id)
            state = _decode(run_id, data) if data is not None else RunViewState(fresh_resume_state(run_id))
            if state.budget_placement is not None:
                self._budget.placements[run_id] = state.budget_placement
            run = self._runs[run_id] = _Run(PortableStateFold(state=state.resume), state.updated_at)
        return run

    @property
    def run_ids(self) -> list[str]:
        return sorted(self._runs)

    def states(self) -> list[tuple[str, int, bytes]]:
        """``(run_id, position, state bytes)`` for every run the batch touched, in run order."""
        return [
            (
                run_id,
                run.fold.run.version,
                _encoder.encode(RunViewState(run.fold.state, self._budget.placements.get(run_id), run.updated_at)),
            )
            for run_id, run in sorted(self._runs.items())
        ]

    def run_rows(self) -> list[RunStateRow]:
        rows = []
        for run_id, run in sorted(self._runs.items()):
            state = run.fold.run
            rows.append(
                RunStateRow(
                    run_id=run_id,
                    position=state.version,
                    stage=str(state.stage),
                    status=state.status,
                    epoch=state.epoch,
                    owner=state.holder,
                    resumability_class=str(resumability(run.fold, run.updated_at).cls),
                    updated_at=run.updated_at,
                )
            )
        return rows

    def budget_rows(self) -> list[BudgetRow]:
        """The batch's additions per ``(dimension, key)``, in key order (the order rows are locked in)."""
        return [BudgetRow(dimension, key, usage) for (dimension, key), usage in sorted(self._budget.rows.items())]


def run_state_params(row: RunStateRow, timestamp: Callable[[int], object]) -> tuple[object, ...]:
    """A ``run_state`` row as SQL parameters, in column order; each backend spells time its way."""
    return (
        row.run_id,
        row.position,
        row.stage,
        row.status,
        row.epoch,
        row.owner,
        row.resumability_class,
        timestamp(row.updated_at),
    )
