"""The views' batch fold (``adapters.views.rows``) equals the pure folds whatever the batching.

Two random valid histories are interleaved (each run keeps its order, as the notification log
does) and cut into random batches; each batch starts only from the previous batches' stored bytes,
exactly as a view store runs it. No I/O.
"""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baton.adapters.views.progress import render
from baton.adapters.views.rows import ViewBatch
from baton.domain.budgets import COUNTERS, Usage
from baton.domain.errors import ChainBroken
from baton.domain.events import Placement, RecordedEvent
from baton.projections.budget_usage import budget_usage
from baton.projections.resumability import classify, summarize

from .projections.histories import histories

PROPERTIES = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def interleaved(draw: st.DrawFn) -> list[RecordedEvent]:
    """Two runs' histories merged in a random order that keeps each run's positions in order."""
    first = draw(histories())
    second = [msgspec.structs.replace(event, run_id="run-2") for event in draw(histories())]
    merged: list[RecordedEvent] = []
    while first or second:
        source = first if second == [] or (first and draw(st.booleans())) else second
        merged.append(source.pop(0))
    return merged


def reference(events: list[RecordedEvent]) -> tuple[dict[str, tuple[object, ...]], dict[tuple[str, str], Usage]]:
    runs = {}
    for run_id in {event.run_id for event in events}:
        history = [event for event in events if event.run_id == run_id]
        summary = summarize(history, run_id)
        now = history[-1].recorded_at
        cls = classify(summary, summary.placement or Placement(worker=""), now).cls
        state = summary.state
        runs[run_id] = (state.version, str(state.stage), state.status, state.epoch, state.holder, str(cls), now)
    return runs, dict(budget_usage(events).rows)


@PROPERTIES
@given(events=interleaved(), cuts=st.lists(st.integers(1, 9), min_size=1, max_size=6))
def test_batches_folded_from_stored_bytes_equal_the_pure_folds(events: list[RecordedEvent], cuts: list[int]) -> None:
    """Folding batch after batch from stored bytes gives the rows the pure folds give for the whole log."""
    stored: dict[str, bytes] = {}
    runs: dict[str, tuple[object, ...]] = {}
    budget: Counter[tuple[str, str, str]] = Counter()
    start, turn = 0, 0
    while start < len(events):
        size = cuts[turn % len(cuts)]
        batch = ViewBatch(stored).apply_all(events[start : start + size])
        stored |= {run_id: state for run_id, _, state in batch.states()}
        for row in batch.run_rows():
            runs[row.run_id] = (row.position, row.stage, row.status, row.epoch, row.owner, row.resumability_class)
            runs[row.run_id] += (row.updated_at,)
        for delta in batch.budget_rows():
            budget.update({(delta.dimension, delta.key, name): getattr(delta.usage, name) for name in COUNTERS})
        start, turn = start + size, turn + 1

    expected_runs, expected_budget = reference(events)
    assert runs == expected_runs
    flattened = Counter(
        {(dim, key, name): getattr(usage, name) for (dim, key), usage in expected_budget.items() for name in COUNTERS}
    )
    assert +budget == +flattened  # unary plus drops zero counters on both sides


@PROPERTIES
@given(events=histories(min_steps=3, max_steps=10))
def test_a_repeated_or_skipped_event_is_refused(events: list[RecordedEvent]) -> None:
    """Given a run's stored fold, when an event that does not continue it arrives, then ChainBroken is raised."""
    batch = ViewBatch({}).apply_all(events)
    stored = {run_id: state for run_id, _, state in batch.states()}

    with pytest.raises(ChainBroken):
        ViewBatch(stored).apply(events[-1])  # a repeat
    with pytest.raises(ChainBroken):
        ViewBatch({}).apply(events[-1] if len(events) > 1 else msgspec.structs.replace(events[0], position=2))


def test_the_progress_line_shows_the_bar_the_count_and_the_rate() -> None:
    """Given 500 of 1,000 events in 2 s, when the line is rendered, then it shows half a bar, counts and 250 ev/s."""
    line = render("rebuild", 500, 1000, 2.0)

    assert line == "rebuild [###############---------------]  50%  500/1,000 events  250 ev/s"
    assert render("rebuild", 7, None, 0.0) == "rebuild 7 events  - ev/s"
