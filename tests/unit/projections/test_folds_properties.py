"""Invariant 11 (projections are pure folds) over random valid histories, built by ``histories.py``.

Rebuilt from scratch, a projection equals the incrementally maintained one whatever the chunking;
time travel (folding the first n events) equals a fold stopped at n; re-running changes nothing;
budgets never decrease; and the checkpoint hash moves exactly when the history it covers does.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from baton.domain.budgets import COUNTERS
from baton.domain.chain import envelope_digest
from baton.domain.events import CheckpointSealed, IntentReconciled, IntentRecorded, ObservationRecorded, RecordedEvent
from baton.domain.state import fold
from baton.projections.portable_state import PortableStateFold, portable_state
from baton.projections.replay import ReplayFold, prefix_steps, replay_prefix
from baton.projections.resumability import ResumabilityClass, classify, summarize, summary_of

from ..domain.given import RUN, altered, placement
from .histories import WORKERS, histories

PROPERTIES = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
chunk_sizes = st.lists(st.integers(1, 6), min_size=1, max_size=8)


def chunked(events: list[RecordedEvent], sizes: list[int]) -> list[list[RecordedEvent]]:
    """``events`` cut into consecutive chunks, cycling through ``sizes``."""
    chunks, start, turn = [], 0, 0
    while start < len(events):
        size = sizes[turn % len(sizes)]
        chunks.append(events[start : start + size])
        start, turn = start + size, turn + 1
    return chunks


def encoded(events: list[RecordedEvent]) -> list[bytes]:
    return [msgspec.json.encode(event) for event in events]


# -- portable state -------------------------------------------------------------------------------


@PROPERTIES
@given(events=histories(), sizes=chunk_sizes)
def test_portable_state_is_the_same_whatever_the_chunking(events: list[RecordedEvent], sizes: list[int]) -> None:
    """Folding chunk by chunk, handing the fold on through its snapshot bytes in between, ends where one fold does."""
    whole = PortableStateFold(RUN)
    for event in events:
        whole.apply(event)

    incremental = PortableStateFold(RUN)
    for chunk in chunked(events, sizes):
        incremental.snapshot()  # a snapshot is a read: it must not disturb the fold
        incremental = PortableStateFold.from_bytes(incremental.to_bytes())  # what the ledger's snapshots do
        for event in chunk:
            incremental.apply(event)

    assert incremental.snapshot() == whole.snapshot() == portable_state(events, RUN)
    assert summary_of(incremental) == summary_of(whole) == summarize(events, RUN)
    assert incremental.replay.outline() == replay_prefix(events).outline()


@PROPERTIES
@given(events=histories())
def test_time_travel_equals_a_fold_stopped_at_n(events: list[RecordedEvent]) -> None:
    """``portable_state(events[:n])`` equals the incremental fold's snapshot after n events, for every n."""
    incremental = PortableStateFold(RUN)
    assert incremental.snapshot() == portable_state([], RUN)
    for n, event in enumerate(events, start=1):
        incremental.apply(event)
        travelled = portable_state(events[:n], RUN)
        assert incremental.snapshot() == travelled
        assert travelled.position == n
        assert travelled.checkpoint_id == f"{RUN}@{n}"


@PROPERTIES
@given(events=histories())
def test_portable_state_agrees_with_the_write_side_fold(events: list[RecordedEvent]) -> None:
    """Usage, ceilings, epoch, owner, stage and head digest are the write side's, at every position."""
    for n in range(len(events) + 1):
        state, portable = fold(events[:n], run_id=RUN), portable_state(events[:n], RUN)
        assert (portable.usage, portable.ceilings, portable.owner_epoch, portable.owner) == (
            state.usage,
            state.ceilings,
            state.epoch,
            state.holder,
        )
        assert (portable.stage, portable.status, portable.head_digest) == (
            str(state.stage),
            state.status,
            state.head_digest,
        )


@PROPERTIES
@given(events=histories())
def test_budget_usage_never_decreases_along_positions(events: list[RecordedEvent]) -> None:
    """Every usage counter of the portable state is monotonic in the position, and within its ceiling."""
    previous = portable_state([], RUN).usage
    for n in range(1, len(events) + 1):
        current = portable_state(events[:n], RUN)
        for name in COUNTERS:
            assert getattr(current.usage, name) >= getattr(previous, name), (n, name)
            ceiling = getattr(current.ceilings, name)
            assert ceiling is None or getattr(current.usage, name) <= ceiling
        previous = current.usage


@PROPERTIES
@given(events=histories())
def test_re_running_the_fold_changes_nothing(events: list[RecordedEvent]) -> None:
    """Folding the same events again gives the identical checkpoint hash, and the events are untouched."""
    before = encoded(events)
    first = portable_state(events, RUN)
    incremental = PortableStateFold(RUN)
    for event in events:
        incremental.apply(event)

    assert portable_state(events, RUN).checkpoint_hash == first.checkpoint_hash
    assert incremental.snapshot().checkpoint_hash == incremental.snapshot().checkpoint_hash == first.checkpoint_hash
    assert encoded(events) == before


# -- the checkpoint hash moves when the history does ---------------------------------------------

# Rewriting these would make the log undecodable or name an operation that has no intent; every
# other leaf of an envelope can change and still be a history the folds accept.
_FIXED_KEYS = frozenset({"type", "digest", "prev_digest", "op_id", "kind", "outcome", "resolution"})
_FIXED_KEYS |= {"failure_reason", "from_stage", "to_stage", "stage"}


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict) and value:
        return [p for key, item in value.items() if key not in _FIXED_KEYS for p in _leaves(item, (*path, key))]
    if isinstance(value, list) and value:
        return [p for index, item in enumerate(value) for p in _leaves(item, (*path, index))]
    return [path] if path else []


def _resealed(events: list[RecordedEvent], index: int, path: tuple[Any, ...]) -> list[RecordedEvent] | None:
    """``events`` with one leaf of event ``index`` changed and the chain re-sealed from there on."""
    envelope = msgspec.to_builtins(events[index])
    parent = envelope
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = altered(parent[path[-1]])
    try:
        changed = msgspec.convert(envelope, RecordedEvent)
    except msgspec.ValidationError:
        return None
    out = [*events[:index], changed, *events[index + 1 :]]
    prev = events[index - 1].digest if index else out[0].prev_digest
    for i in range(index, len(out)):
        draft = msgspec.structs.replace(out[i], prev_digest=prev, digest="")
        builtins = msgspec.to_builtins(draft)
        del builtins["digest"]
        out[i] = msgspec.structs.replace(draft, digest=envelope_digest(builtins))
        prev = out[i].digest
    return out


@PROPERTIES
@given(events=histories(), data=st.data())
def test_checkpoint_hash_changes_from_the_changed_event_on(events: list[RecordedEvent], data: st.DataObject) -> None:
    """Changing any field of any event changes the hash at its position and after, and nowhere before."""
    index = data.draw(st.integers(0, len(events) - 1), label="event index")
    path = data.draw(st.sampled_from(_leaves(msgspec.to_builtins(events[index]))), label="field path")
    changed = _resealed(events, index, path)
    assume(changed is not None and changed[index] != events[index])
    assert changed is not None
    hashes = [portable_state(changed[:n], RUN).checkpoint_hash for n in range(len(events) + 1)]
    original = [portable_state(events[:n], RUN).checkpoint_hash for n in range(len(events) + 1)]

    assert hashes[: index + 1] == original[: index + 1]
    assert all(new != old for new, old in zip(hashes[index + 1 :], original[index + 1 :], strict=True)), path


# -- replay prefix ---------------------------------------------------------------------------------


@PROPERTIES
@given(events=histories(), sizes=chunk_sizes)
def test_replay_prefix_equals_the_incremental_fold_at_every_position(
    events: list[RecordedEvent], sizes: list[int]
) -> None:
    """``replay_prefix(events[:n])`` equals the outline of a ReplayFold fed chunk by chunk, and its streamed steps."""
    incremental = ReplayFold()
    assert incremental.outline() == replay_prefix([]).outline()
    n = 0
    for chunk in chunked(events, sizes):
        for event in chunk:
            incremental.apply(event)
        n += len(chunk)
        expected = replay_prefix(events[:n])
        outline = incremental.outline()
        assert outline == expected.outline()
        after_start = [event for event in events[:n] if event.position > outline.start]
        assert tuple(prefix_steps(after_start, outline.length)) == expected.steps


@PROPERTIES
@given(events=histories())
def test_replay_prefix_agrees_with_the_write_side_operations(events: list[RecordedEvent]) -> None:
    """Uncertain ops are the write side's open ones; the prefix is every op intended after the last
    sealed checkpoint and before the first uncertain one, in intent order, with its outcome's position."""
    state, prefix = fold(events, run_id=RUN), replay_prefix(events)

    assert {step.op_id for step in prefix.uncertain} == set(state.operations)
    sealed = [event.position for event in events if isinstance(event.body, CheckpointSealed)]
    assert prefix.start == (sealed[-1] if sealed else 0)
    first_uncertain = prefix.uncertain[0].intent_position if prefix.uncertain else float("inf")
    intents = [e for e in events if isinstance(e.body, IntentRecorded) and prefix.start < e.position < first_uncertain]
    outcomes = {e.body.op_id: e.position for e in events if isinstance(e.body, ObservationRecorded | IntentReconciled)}
    assert [step.intent_position for step in prefix.steps] == [e.position for e in intents]
    for step in prefix.steps:
        assert step.outcome is not None and step.outcome_position == outcomes[step.op_id]


# -- resumability ----------------------------------------------------------------------------------


@PROPERTIES
@given(events=histories(), worker=st.sampled_from(WORKERS), later=st.integers(0, 60_000_000))
def test_classification_is_total_and_always_explained(events: list[RecordedEvent], worker: str, later: int) -> None:
    """Every history gets a class with at least one reason, and R0 exactly when the run is closed."""
    summary = summarize(events, RUN)

    result = classify(summary, placement(worker), events[-1].recorded_at + later)

    assert result.reasons
    assert (result.cls is ResumabilityClass.R0) == summary.state.closed
