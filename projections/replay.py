"""The replay prefix, and the cursor a resuming worker consumes it with.

A resuming worker regenerates its intents from the portable state. For each operation whose
outcome is recorded, the cursor returns that outcome instead of calling the outside world again,
provided the regenerated intent matches the recorded one exactly; the first uncertain intent ends
the prefix, and nothing new may happen until it is reconciled.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Literal

import msgspec

from baton.domain.decide import context_digest
from baton.domain.errors import ReplayDivergence, ReplayIncomplete, UncertainIntent
from baton.domain.events import (
    BlobRef,
    CheckpointSealed,
    IntentContext,
    IntentReconciled,
    IntentRecorded,
    ObservationRecorded,
    RecordedEvent,
    StageReserved,
)

__all__ = [
    "PrefixOutline",
    "ReplayCursor",
    "ReplayDivergence",
    "ReplayFold",
    "ReplayIncomplete",
    "ReplayPrefix",
    "ReplayStep",
    "OpenOperation",
    "ReplayWindow",
    "StageReservation",
    "prefix_steps",
    "replay_prefix",
]

Outcome = Literal["ok", "failed", "applied", "not_applied", "abandoned"]


class StageReservation(msgspec.Struct, frozen=True):
    """A recorded ``StageReserved``: a replay reserves the same fuel again (it is never refunded)."""

    stage_id: str
    fuel: int


class ReplayStep(msgspec.Struct, frozen=True):
    """One operation of the prefix: the recorded intent, the stage reservations before it, how it ended."""

    op_id: str
    kind: str
    tool_contract: str
    context: IntentContext
    context_digest: str
    intent_position: int
    outcome: Outcome | None = None
    outcome_position: int | None = None
    failure_reason: str | None = None
    result: Any = None
    result_ref: BlobRef | None = None
    reservations: tuple[StageReservation, ...] = ()


class ReplayPrefix(msgspec.Struct, frozen=True):
    """Settled operations in intent order up to the first uncertain one, and the uncertain ones.

    The prefix starts after the last sealed checkpoint (``start``): a resuming worker restores the
    checkpoint's task state and regenerates only what was intended after it.
    """

    steps: tuple[ReplayStep, ...]
    uncertain: tuple[ReplayStep, ...]
    start: int = 0

    def outline(self) -> PrefixOutline:
        return PrefixOutline(self.start, len(self.steps), self.uncertain)


class PrefixOutline(msgspec.Struct, frozen=True):
    """A prefix without its settled steps: bounded whatever the run's length.

    The ``length`` settled steps are read back from the log after ``start`` when a worker replays
    them (``prefix_steps``), so a resume holds the prefix one step at a time.
    """

    start: int
    length: int
    uncertain: tuple[ReplayStep, ...]


class OpenOperation(msgspec.Struct, array_like=True):
    """An intent in the window, as recorded (no copy), and its outcome once one is recorded."""

    intent: IntentRecorded
    position: int
    reservations: tuple[StageReservation, ...] = ()
    outcome: ObservationRecorded | IntentReconciled | None = None
    outcome_position: int = 0

    def step(self) -> ReplayStep:
        intent, outcome = self.intent, self.outcome
        step = ReplayStep(
            intent.op_id,
            intent.kind,
            intent.tool_contract,
            intent.context,
            intent.context_digest,
            self.position,
            reservations=self.reservations,
        )
        if outcome is None:
            return step
        ended: Outcome
        if isinstance(outcome, ObservationRecorded):
            ended, reason = outcome.outcome, outcome.failure_reason
        else:
            ended, reason = outcome.resolution, None
        return msgspec.structs.replace(
            step,
            outcome=ended,
            outcome_position=self.outcome_position,
            failure_reason=reason,
            result=outcome.result,
            result_ref=outcome.result_ref,
        )


class ReplayWindow(msgspec.Struct):
    """The fold's whole state: what it keeps between events (and in snapshots).

    ``open`` holds the operations from the first unsettled intent on, in intent order; settled
    operations in front of it leave the window and are only counted.
    """

    start: int = 0
    settled: int = 0
    open: list[OpenOperation] = []
    reserved: list[StageReservation] = []  # recorded since the last intent: they belong to the next one


class ReplayFold:
    """Counts the prefix as it grows; holds only the window from the first unsettled intent on.

    With ``emit`` it also returns the steps each event adds to the prefix (``prefix_steps`` streams
    them); without, settling the front operation costs no allocation at all.
    """

    def __init__(self, window: ReplayWindow | None = None, *, emit: bool = False) -> None:
        self.window = ReplayWindow() if window is None else window
        self.emit = emit

    def apply(self, event: RecordedEvent) -> tuple[ReplayStep, ...]:
        """Fold one event; with ``emit``, return the steps it added to the prefix, in intent order."""
        body, window = event.body, self.window
        kind = type(body)
        if kind is IntentRecorded:
            reserved = tuple(window.reserved)
            window.open.append(OpenOperation(body, event.position, reserved))  # type: ignore[arg-type]
            if reserved:
                window.reserved.clear()
        elif kind is ObservationRecorded or kind is IntentReconciled:
            return self._settle(body, event.position)  # type: ignore[arg-type]
        elif kind is StageReserved:
            window.reserved.append(StageReservation(body.stage_id, body.fuel))  # type: ignore[union-attr]
        elif kind is CheckpointSealed:
            # sealing needs every intent settled (decide), so nothing open is lost here
            window.start, window.settled = event.position, 0
            window.reserved.clear()
            window.open = [entry for entry in window.open if entry.outcome is None]
        return ()

    def _settle(self, outcome: ObservationRecorded | IntentReconciled, position: int) -> tuple[ReplayStep, ...]:
        entries = self.window.open
        for index in range(len(entries) - 1, -1, -1):
            entry = entries[index]
            if entry.intent.op_id == outcome.op_id:
                entry.outcome, entry.outcome_position = outcome, position
                break
        ready = 0
        while ready < len(entries) and entries[ready].outcome is not None:
            ready += 1
        if not ready:
            return ()
        drained = tuple(entry.step() for entry in entries[:ready]) if self.emit else ()
        del entries[:ready]
        self.window.settled += ready
        return drained

    def outline(self) -> PrefixOutline:
        window = self.window
        uncertain = tuple(entry.step() for entry in window.open if entry.outcome is None)
        return PrefixOutline(window.start, window.settled, uncertain)


def prefix_steps(events: Iterable[RecordedEvent], length: int) -> Iterator[ReplayStep]:
    """The first ``length`` settled steps of the events after a prefix's start, one at a time."""
    if length <= 0:
        return
    fold, produced = ReplayFold(emit=True), 0
    for event in events:
        for step in fold.apply(event):
            yield step
            produced += 1
            if produced == length:
                return


def replay_prefix(events: Iterable[RecordedEvent]) -> ReplayPrefix:
    """Fold a run's events (in position order) into its replay prefix, steps and all.

    Holds every step of the prefix: for a bounded resume use ``ReplayFold.outline`` and read the
    steps with ``prefix_steps``.
    """
    fold, steps = ReplayFold(emit=True), list[ReplayStep]()
    for event in events:
        if isinstance(event.body, CheckpointSealed):
            steps = []
        steps.extend(fold.apply(event))
    outline = fold.outline()
    return ReplayPrefix(tuple(steps), outline.uncertain, outline.start)


class ReplayCursor:
    """Hands recorded outcomes back to a resuming worker, one regenerated intent at a time."""

    def __init__(self, prefix: ReplayPrefix | PrefixOutline, steps: Iterable[ReplayStep] | None = None) -> None:
        """Replay ``prefix``; for an outline, ``steps`` streams its settled steps (``prefix_steps``)."""
        if isinstance(prefix, ReplayPrefix):
            self._steps, self._length = iter(prefix.steps), len(prefix.steps)
        else:
            if steps is None:
                raise TypeError("a prefix outline needs the stream of its steps")
            self._steps, self._length = iter(steps), prefix.length
        self._uncertain = prefix.uncertain
        self._next = 0
        self._peeked: ReplayStep | None = None
        self._reserved: list[StageReservation] = []

    @property
    def consumed(self) -> bool:
        return self._next >= self._length

    @property
    def uncertain(self) -> tuple[ReplayStep, ...]:
        """The intents with no recorded outcome, which must be settled before any new effect."""
        return self._uncertain

    def offer(self, op_id: str, kind: str, tool_contract: str, context: IntentContext) -> ReplayStep | None:
        """The recorded outcome for this intent, or ``None`` once the prefix is consumed.

        ``None`` means: this is a new operation; call the host (after ``require_new_effects_allowed``).
        """
        if self.consumed:
            self.require_new_effects_allowed()
            return None
        step = self._peek()
        if tuple(self._reserved) != step.reservations:
            self._refuse_reservations(step)
        offered = {"op_id": op_id, "kind": kind, "tool_contract": tool_contract}
        differing = tuple(name for name, value in offered.items() if value != getattr(step, name))
        try:
            regenerated = context_digest(context)
        except (TypeError, ValueError) as exc:
            msg = f"replay diverged at position {step.intent_position}: the context is not encodable ({exc})"
            raise ReplayDivergence(msg, step.intent_position, ("context.arguments",)) from None
        if regenerated != step.context_digest:
            differing += tuple(
                f"context.{name}"
                for name in context.__struct_fields__
                if getattr(context, name) != getattr(step.context, name)
            ) or ("context",)
        if differing:
            msg = f"replay diverged at position {step.intent_position}: {', '.join(differing)} differ from the record"
            raise ReplayDivergence(msg, step.intent_position, differing)
        self._next += 1
        self._peeked = None
        self._reserved.clear()
        return step

    def next_reservations(self) -> tuple[StageReservation, ...]:
        """The stages to reserve again (submit ``ReserveStage``, then ``reserved``) before the next offer."""
        return () if self.consumed else self._peek().reservations

    def reserved(self, stage_id: str, fuel: int) -> None:
        """Tell the cursor that this replay's ``ReserveStage(stage_id, fuel)`` was accepted."""
        self._reserved.append(StageReservation(stage_id, fuel))

    def _peek(self) -> ReplayStep:
        if self._peeked is None:
            self._peeked = next(self._steps, None)
            if self._peeked is None:
                msg = f"the log holds fewer than the {self._length} recorded operations this prefix promised"
                raise ReplayIncomplete(msg)
        return self._peeked

    def _refuse_reservations(self, step: ReplayStep) -> None:
        wanted = ", ".join(f"{r.stage_id} ({r.fuel} fuel)" for r in step.reservations) or "none"
        done = ", ".join(f"{r.stage_id} ({r.fuel} fuel)" for r in self._reserved) or "none"
        prefix_so_far = step.reservations[: len(self._reserved)] == tuple(self._reserved)
        if len(self._reserved) < len(step.reservations) and prefix_so_far:
            msg = f"before replaying position {step.intent_position}, reserve again: {wanted} (reserved so far: {done})"
            raise ReplayIncomplete(msg)
        msg = f"replay diverged at position {step.intent_position}: reserved {done}, the record reserved {wanted}"
        raise ReplayDivergence(msg, step.intent_position, ("stage_reservations",))

    def require_new_effects_allowed(self) -> None:
        """Refuse new effects until the prefix is consumed and nothing is uncertain."""
        if not self.consumed:
            remaining = self._length - self._next
            raise ReplayIncomplete(f"{remaining} recorded operations must be replayed before any new effect")
        if self._uncertain:
            first = self._uncertain[0]
            msg = f"operation {first.op_id!r} (position {first.intent_position}) has no recorded outcome: reconcile it"
            raise UncertainIntent(msg)
