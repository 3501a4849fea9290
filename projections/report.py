"""A run as a report a person can read: its events by worker and epoch, its stages, its handoffs and
lease takeovers, its budget burn-down against the ceilings, and the audit's verdict.

A pure fold (``ReportFold.apply`` one event at a time, then ``finish`` with the audit's problems):
no I/O, no rendering. ``adapters.report`` turns the model into one self-contained HTML page.

A refused append stores nothing, so the log holds no trace of a rejected stale append: what the
report can show is each *epoch change*, the first event stamped with a new epoch, from where an
append at any older epoch is refused (``stale_epoch``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

import msgspec

from baton.domain.budgets import COUNTERS, MAX_COUNTER, Ceilings
from baton.domain.canonical import short
from baton.domain.events import (
    HandoffAborted,
    HandoffAccepted,
    HandoffPrepared,
    LeaseExpired,
    LeaseGranted,
    LeaseReleased,
    LeaseRenewed,
    RecordedEvent,
    RunOpened,
    TransitionRecorded,
)
from baton.domain.stages import Stage
from baton.projections.audit_state import Problem

__all__ = [
    "KINDS",
    "BudgetSeries",
    "EpochChange",
    "HandoffMark",
    "Mark",
    "ReportFold",
    "RunReport",
    "StageBand",
    "build_report",
]

Kind = Literal["life", "lease", "operation", "stage", "checkpoint", "authority", "handoff"]
KINDS: dict[str, Kind] = {
    "RunOpened": "life",
    "RunCompleted": "life",
    "RunFailed": "life",
    "LeaseGranted": "lease",
    "LeaseRenewed": "lease",
    "LeaseReleased": "lease",
    "LeaseExpired": "lease",
    "StageReserved": "operation",
    "IntentRecorded": "operation",
    "ObservationRecorded": "operation",
    "IntentReconciled": "operation",
    "TransitionRecorded": "stage",
    "CheckpointSealed": "checkpoint",
    "AuthorityGranted": "authority",
    "AuthorityRevoked": "authority",
    "EvidenceRecorded": "authority",
    "ApprovalGranted": "authority",
    "ApprovalDenied": "authority",
    "HandoffPrepared": "handoff",
    "HandoffAccepted": "handoff",
    "HandoffAborted": "handoff",
}
"""The family of each event type: the renderer colours marks by it."""


class Mark(msgspec.Struct, frozen=True):
    """One stored event on the timeline."""

    position: int
    type: str
    kind: str
    worker: str
    epoch: int
    recorded_at: int
    summary: str
    problems: tuple[str, ...] = ()  # the audit's codes at this position


class StageBand(msgspec.Struct, frozen=True):
    """The positions ``first..last`` during which the run was in ``stage``."""

    stage: str
    first: int
    last: int


class EpochChange(msgspec.Struct, frozen=True):
    """The first event stamped with a new epoch: from here an append at an older epoch is refused."""

    position: int
    epoch: int
    worker: str  # the new lease holder ("" when no grant names one)
    previous_worker: str
    how: str  # first lease, after release, takeover after expiry, handoff, imported ...
    takeover: bool  # another worker took the run on after the holder's lease expired


class HandoffMark(msgspec.Struct, frozen=True):
    position: int
    step: Literal["prepared", "accepted", "aborted"]
    document_digest: str
    worker: str  # who appended it
    destination: str = ""  # prepared: the worker the lease moves to


class BudgetSeries(msgspec.Struct, frozen=True):
    """One counter's usage over positions (a point where it changed) and its ceiling, if any."""

    counter: str
    ceiling: int | None
    points: tuple[tuple[int, int], ...]  # (position, usage after that event), starting at the first event

    @property
    def used(self) -> int:
        return self.points[-1][1] if self.points else 0


class RunReport(msgspec.Struct, frozen=True):
    run_id: str
    head: int  # the last position read
    status: str  # open, completed or failed
    stage: str
    first_at: int
    last_at: int
    workers: tuple[str, ...]  # one timeline lane each, in order of first appearance
    marks: tuple[Mark, ...]
    bands: tuple[StageBand, ...]
    epochs: tuple[EpochChange, ...]
    handoffs: tuple[HandoffMark, ...]
    budgets: tuple[BudgetSeries, ...]
    problems: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def _placement(worker: str, model: str, provider: str, region: str) -> str:
    where = ", ".join(v for v in (model, provider, region) if v)
    return f"{worker} ({where})" if where else worker


_SUMMARIES: dict[str, Callable[[Any], str]] = {
    "RunOpened": lambda b: f"release {b.release_id}, schema {b.schema_name} v{b.schema_version}",
    "LeaseGranted": lambda b: (
        f"epoch {b.epoch} to " + _placement(b.worker, b.placement.model, b.placement.provider, b.placement.region)
    ),
    "LeaseRenewed": lambda b: f"{b.worker}, epoch {b.epoch}",
    "LeaseReleased": lambda b: f"{b.worker}, epoch {b.epoch}",
    "LeaseExpired": lambda b: f"{b.worker}'s lease of epoch {b.epoch}",
    "StageReserved": lambda b: f"{b.stage_id}: {b.fuel} fuel",
    "IntentRecorded": lambda b: f"{b.op_id}: {b.kind} {b.context.operation} via {b.tool_contract}",
    "ObservationRecorded": lambda b: f"{b.op_id}: {b.outcome}" + (f" ({b.failure_reason})" if b.failure_reason else ""),
    "IntentReconciled": lambda b: f"{b.op_id}: {b.resolution}",
    "TransitionRecorded": lambda b: f"{b.from_stage} -> {b.to_stage}",
    "CheckpointSealed": lambda b: f"{b.checkpoint_id} at {b.stage}",
    "AuthorityGranted": lambda b: f"{b.grant_id}: {b.capability} for {b.worker} at epoch {b.epoch}, by {b.granted_by}",
    "AuthorityRevoked": lambda b: f"{b.grant_id}: {b.reason}",
    "EvidenceRecorded": lambda b: f"{b.evidence_id}: {b.verdict} for {short(b.artifact_digest)}",
    "ApprovalGranted": lambda b: f"{b.approval_id}: {short(b.artifact_digest)} approved by {b.approver}",
    "ApprovalDenied": lambda b: f"{b.approval_id}: {short(b.artifact_digest)} denied by {b.approver}",
    "HandoffPrepared": lambda b: f"document {short(b.document_digest)} to {b.destination.worker}",
    "HandoffAccepted": lambda b: f"document {short(b.document_digest)}" + (" (imported)" if b.imported else ""),
    "HandoffAborted": lambda b: f"document {short(b.document_digest)}: {b.reason}",
    "RunCompleted": lambda b: str(b.summary),
    "RunFailed": lambda b: f"{b.reason}" + (f": {b.detail}" if b.detail else ""),
}


class ReportFold:
    """Feed a run's events in position order with ``apply``, then ``finish`` with the audit's problems."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._marks: list[Mark] = []
        self._workers: dict[str, None] = {}
        self._bands: list[StageBand] = []
        self._stage: str = Stage.GENERATING
        self._stage_from = 0
        self._stamped: dict[int, int] = {}  # epoch -> the first position stamped with it
        self._grants: dict[int, EpochChange] = {}  # epoch -> its grant (or import), and how it came about
        self._handoffs: list[HandoffMark] = []
        self._usage = dict.fromkeys(COUNTERS, 0)
        self._points: dict[str, list[tuple[int, int]]] = {name: [] for name in COUNTERS}
        self._ceilings = Ceilings()
        self._status = "open"
        # the lease as the log tells it: who, until when, and how it ended
        self._holder = ""
        self._expires_at = 0
        self._ended: Literal["live", "released", "expired"] = "live"
        self._prepared = False  # the last event was a HandoffPrepared: the next grant is its lease move

    @property
    def events(self) -> int:
        return len(self._marks)

    def apply(self, event: RecordedEvent) -> None:
        body = event.body
        if not self._marks:
            self._stage_from = event.position
            for name in COUNTERS:
                self._points[name].append((event.position, 0))
        self._workers.setdefault(event.worker)
        self._stamped.setdefault(event.epoch, event.position)
        summary = _SUMMARIES.get(event.type, lambda _: "")(body)
        self._marks.append(
            Mark(
                event.position,
                event.type,
                KINDS.get(event.type, "life"),
                event.worker,
                event.epoch,
                event.recorded_at,
                summary,
            )
        )
        self._lease(event)
        self._handoff(event)
        if isinstance(body, RunOpened):
            self._ceilings = body.ceilings
        elif isinstance(body, TransitionRecorded):
            self._enter(body.to_stage, event.position)
        elif event.type in ("RunCompleted", "RunFailed"):
            self._status = "completed" if event.type == "RunCompleted" else "failed"
        charge = getattr(body, "charge", None)
        if charge is not None:
            self._charge(event.position, {name: self._usage[name] + getattr(charge, name) for name in COUNTERS})

    def _enter(self, stage: str, position: int) -> None:
        if position > self._stage_from:
            self._bands.append(StageBand(self._stage, self._stage_from, position - 1))
        self._stage, self._stage_from = stage, position

    def _charge(self, position: int, usage: dict[str, int]) -> None:
        # plain sums, never checked: a negative or overflowing charge is the audit's to name, not a crash here
        for name, value in usage.items():
            if value != self._usage[name]:
                self._usage[name] = value
                self._points[name].append((position, value))

    def _lease(self, event: RecordedEvent) -> None:
        body = event.body
        if isinstance(body, LeaseGranted):
            previous = self._holder
            if self._prepared:
                how, takeover = f"handoff from {previous}", False
            elif not previous:
                how, takeover = "first lease", False
            elif self._ended == "released":
                how, takeover = f"after {previous} released its lease", False
            elif self._ended == "expired" or event.recorded_at >= self._expires_at:
                takeover = body.worker != previous
                how = f"takeover: {previous}'s lease expired" if takeover else "re-acquired after its lease expired"
            else:
                how, takeover = f"while {previous}'s lease was live", body.worker != previous
            self._grants.setdefault(
                body.epoch, EpochChange(event.position, body.epoch, body.worker, previous, how, takeover)
            )
            self._holder, self._expires_at, self._ended = body.worker, body.expires_at, "live"
        elif isinstance(body, LeaseRenewed) and body.worker == self._holder:
            self._expires_at = body.expires_at
        elif isinstance(body, LeaseReleased) and body.worker == self._holder:
            self._ended = "released"
        elif isinstance(body, LeaseExpired) and body.worker == self._holder:
            self._ended = "expired"
        self._prepared = isinstance(body, HandoffPrepared)

    def _handoff(self, event: RecordedEvent) -> None:
        body = event.body
        if isinstance(body, HandoffPrepared):
            self._handoffs.append(
                HandoffMark(event.position, "prepared", body.document_digest, event.worker, body.destination.worker)
            )
        elif isinstance(body, HandoffAborted):
            self._handoffs.append(HandoffMark(event.position, "aborted", body.document_digest, event.worker))
        elif isinstance(body, HandoffAccepted):
            self._handoffs.append(HandoffMark(event.position, "accepted", body.document_digest, event.worker))
            self._ceilings = body.ceilings
            if body.imported:  # the run continues from another store: its stage, usage and epoch come along
                self._enter(body.stage, event.position)
                imported = EpochChange(
                    event.position, event.epoch, event.worker, "", "imported from another store", False
                )
                self._grants.setdefault(event.epoch, imported)
                self._holder, self._expires_at, self._ended = event.worker, MAX_COUNTER, "live"  # expiry unknown here
                self._charge(event.position, {name: getattr(body.carried, name) for name in COUNTERS})

    def finish(self, problems: Iterable[Problem] = ()) -> RunReport:
        """The report, with the audit's ``problems`` (of this run) attached to their positions."""
        listed = tuple(sorted((p for p in problems if p.run_id == self.run_id), key=lambda p: p.position))
        codes: dict[int, list[str]] = {}
        for problem in listed:
            codes.setdefault(problem.position, []).append(problem.code)
        marks = tuple(
            msgspec.structs.replace(m, problems=tuple(codes[m.position])) if m.position in codes else m
            for m in self._marks
        )
        head = self._marks[-1].position if self._marks else 0
        bands = list(self._bands)
        if self._marks and head >= self._stage_from:
            bands.append(StageBand(self._stage, self._stage_from, head))
        return RunReport(
            run_id=self.run_id,
            head=head,
            status=self._status,
            stage=str(self._stage),
            first_at=self._marks[0].recorded_at if self._marks else 0,
            last_at=self._marks[-1].recorded_at if self._marks else 0,
            workers=tuple(self._workers),
            marks=marks,
            bands=tuple(bands),
            epochs=self._epoch_changes(),
            handoffs=tuple(self._handoffs),
            budgets=tuple(
                BudgetSeries(name, getattr(self._ceilings, name), tuple(self._points[name])) for name in COUNTERS
            ),
            problems=listed,
        )

    def _epoch_changes(self) -> tuple[EpochChange, ...]:
        """One change per epoch above 0, where it first shows: its grant, or the first event stamped with it.

        A handoff's grant is stamped with the source's epoch and precedes the first event of the new
        one; a lease takeover's expiry is stamped with the new epoch and precedes its grant.
        """
        changes = []
        for epoch in sorted((self._stamped.keys() | self._grants.keys()) - {0}):
            grant = self._grants.get(epoch)
            stamped = self._stamped.get(epoch)
            if grant is None:
                changes.append(EpochChange(stamped or 0, epoch, "", "", "no lease grant in the log", takeover=False))
            else:
                changes.append(msgspec.structs.replace(grant, position=min(grant.position, stamped or grant.position)))
        return tuple(changes)


def build_report(run_id: str, events: Iterable[RecordedEvent], problems: Iterable[Problem] = ()) -> RunReport:
    """The report of ``run_id`` from its events in position order and the audit's problems."""
    fold = ReportFold(run_id)
    for event in events:
        fold.apply(event)
    return fold.finish(problems)
