"""The audit's snapshot check: a stored resume snapshot must be exactly the fold at its position."""

from __future__ import annotations

import msgspec
from hypothesis import given as hypothesis_given
from hypothesis import settings
from hypothesis import strategies as st

from baton.domain.events import RecordedEvent
from baton.projections.audit import AuditFold, Problem
from baton.projections.portable_state import PortableStateFold

from ..domain.given import RUN, given
from .histories import histories


def fold_bytes(log: list[RecordedEvent], position: int) -> bytes:
    """What a resume writes as the snapshot at ``position``: the fold of the first ``position`` events."""
    fold = PortableStateFold(RUN)
    for event in log[:position]:
        fold.apply(event)
    return fold.to_bytes()


def audited(log: list[RecordedEvent], snapshots: dict[int, bytes]) -> list[Problem]:
    fold = AuditFold(RUN, snapshots=snapshots)
    for event in log:
        fold.apply(event)
    return fold.finish((log[-1].position, log[-1].digest))


def short_log() -> list[RecordedEvent]:
    return given().opened().leased().intended("op-1").observed("op-1").intended("op-2").observed("op-2").log


@settings(max_examples=40, deadline=None)
@hypothesis_given(histories(max_steps=40), st.data())
def test_snapshots_equal_to_the_fold_audit_clean_and_an_altered_one_is_named(
    log: list[RecordedEvent], data: st.DataObject
) -> None:
    """Given any valid history and snapshots taken from its fold, then no problem; when one of them is
    re-encoded with another call count, then snapshot_mismatch at exactly its position."""
    positions = data.draw(st.sets(st.integers(1, len(log)), min_size=1, max_size=4))
    snapshots = {p: fold_bytes(log, p) for p in positions}
    assert audited(log, snapshots) == []

    altered = data.draw(st.sampled_from(sorted(positions)))
    fold = PortableStateFold.from_bytes(snapshots[altered])
    fold.run.usage = msgspec.structs.replace(fold.run.usage, calls=fold.run.usage.calls + 1)
    problems = audited(log, {**snapshots, altered: fold.to_bytes()})
    assert [(p.position, p.code) for p in problems] == [(altered, "snapshot_mismatch")]
    assert "run.usage" in problems[0].detail


def test_a_snapshot_of_another_position_or_past_the_end_or_not_a_fold_is_named() -> None:
    """Given snapshots holding the fold of another position, bytes that are no fold, and one past the log's
    end, then each is snapshot_mismatch at its own position."""
    log = short_log()
    problems = audited(log, {3: fold_bytes(log, 4), 4: b"\x00not a fold", 9: fold_bytes(log, 6)})
    assert [(p.position, p.code) for p in problems] == [(n, "snapshot_mismatch") for n in (3, 4, 9)]
    assert "not a resume state" in problems[1].detail and "after the log's end (6)" in problems[2].detail


def test_a_snapshot_where_the_log_has_a_gap_is_named() -> None:
    """Given a log with position 3 deleted and a snapshot at 3, then the gap and the snapshot are both named."""
    log = short_log()
    problems = audited(log[:2] + log[3:], {3: fold_bytes(log, 3)})
    assert {(p.position, p.code) for p in problems} >= {(3, "position_gap"), (3, "snapshot_mismatch")}
