"""The audit's check of a run's stored resume snapshots: each must be the resume fold at its position.

Snapshots are a cache, never evidence (invariant 16). A resume uses one only when its tag says the
store wrote it there; a tag proves who wrote a row, not that the row is true, so the audit, which
reads the whole run anyway, compares every stored snapshot with the fold itself. The caller hands
in what each row claims (position -> the fold's bytes, tag removed: an adapter reads the store);
this check runs a ``PortableStateFold`` beside the audit up to the last snapshot's position and
compares there what a resume would believe: the row decoded as a resume decodes it, encoded again
with the fold's own encoder (``to_bytes``, the one a snapshot is written with), against the fold's
encoding. So a field added since the row was written, with its default, is no difference, and a
value the fold does not hold is one. Runs without snapshots cost nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from baton.domain.events import RecordedEvent
from baton.projections.audit_state import AuditState
from baton.projections.portable_state import PortableStateFold, ResumeState

__all__ = ["SnapshotCheck"]


class SnapshotCheck:
    """Feed the audit's in-order events to ``apply``, then call ``finish``; problems go to the state."""

    def __init__(self, run_id: str, snapshots: Mapping[int, bytes]) -> None:
        self._claims = dict(snapshots)
        self._due = sorted(snapshots, reverse=True)  # positions still to compare, the next one last
        self._fold = PortableStateFold(run_id)

    def apply(self, state: AuditState, event: RecordedEvent) -> None:
        due = self._due
        if not due:
            return
        while due and due[-1] < event.position:  # that position's event was missing or undecodable
            missed = due.pop()
            state.report("snapshot_mismatch", "a snapshot at a position the log holds no readable event at", missed)
        self._fold.apply(event)
        if due and due[-1] == event.position:
            self._compare(state, due.pop())

    def finish(self, state: AuditState, head: int) -> None:
        """Report the snapshots past the log's end (``head``: its last position)."""
        while self._due:
            position = self._due.pop()
            state.report("snapshot_mismatch", f"a snapshot at a position after the log's end ({head})", position)

    def _compare(self, state: AuditState, position: int) -> None:
        try:
            believed = PortableStateFold.from_bytes(self._claims[position])
        except (msgspec.DecodeError, msgspec.ValidationError):
            state.report("snapshot_mismatch", "the stored snapshot is not a resume state in this shape", position)
            return
        if believed.to_bytes() == self._fold.to_bytes():
            return
        detail = (
            f"the stored snapshot is not the fold at this position ({_differences(believed.state, self._fold.state)})"
        )
        state.report("snapshot_mismatch", detail, position)


def _differences(stored: ResumeState, actual: ResumeState) -> str:
    """Which fields of the fold a snapshot gets wrong (``run.usage``, ``placement``...), for the report."""
    differing = [f"run.{name}" for name in _differing(stored.run, actual.run)]
    differing += [name for name in _differing(stored, actual) if name != "run"]
    return "differs in " + ", ".join(differing) if differing else "differs in its encoding"


def _differing(stored: Any, actual: Any) -> list[str]:
    return [name for name in type(actual).__struct_fields__ if getattr(stored, name) != getattr(actual, name)]
