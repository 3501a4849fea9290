"""The replay prefix, and the cursor a resuming worker consumes it with.

A resuming worker regenerates its intents from the portable state. For each operation whose
outcome is recorded, the cursor returns that outcome instead of calling the outside world again,
provided the regenerated intent matches the recorded one exactly; the first uncertain intent ends
the prefix, and nothing new may happen until it is reconciled.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import msgspec

from domain.decide import context_digest
from domain.errors import ReplayDivergence, ReplayIncomplete, UncertainIntent
from domain.events import (
    BlobRef,
    IntentContext,
    IntentReconciled,
    IntentRecorded,
    ObservationRecorded,
    RecordedEvent,
)

__all__ = [
    "ReplayCursor",
    "ReplayDivergence",
    "ReplayFold",
    "ReplayIncomplete",
    "ReplayPrefix",
    "ReplayStep",
    "replay_prefix",
]

Outcome = Literal["ok", "failed", "applied", "not_applied", "abandoned"]


class ReplayStep(msgspec.Struct, frozen=True):
    """One operation of the prefix: the recorded intent and how it ended."""

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


class ReplayPrefix(msgspec.Struct, frozen=True):
    """Settled operations in intent order up to the first uncertain one, and the uncertain ones."""

    steps: tuple[ReplayStep, ...]
    uncertain: tuple[ReplayStep, ...]


class ReplayFold:
    """Operations by op id; the prefix orders them by the position of their intents."""

    def __init__(self, ops: dict[str, ReplayStep] | None = None) -> None:
        self.ops: dict[str, ReplayStep] = {} if ops is None else ops

    def apply(self, event: RecordedEvent) -> None:
        body = event.body
        if isinstance(body, IntentRecorded):
            self.ops[body.op_id] = ReplayStep(
                body.op_id, body.kind, body.tool_contract, body.context, body.context_digest, event.position
            )
        elif isinstance(body, ObservationRecorded):
            self._settle(body.op_id, body.outcome, event.position, body.failure_reason, body.result, body.result_ref)
        elif isinstance(body, IntentReconciled):
            self._settle(body.op_id, body.resolution, event.position, None, body.result, body.result_ref)

    def _settle(
        self, op_id: str, outcome: Outcome, position: int, reason: str | None, result: Any, ref: BlobRef | None
    ) -> None:
        step = self.ops[op_id]
        self.ops[op_id] = msgspec.structs.replace(
            step, outcome=outcome, outcome_position=position, failure_reason=reason, result=result, result_ref=ref
        )

    def prefix(self) -> ReplayPrefix:
        # order by intent position, not by dict order: a snapshot's map may come back key-sorted
        ordered = sorted(self.ops.values(), key=lambda step: step.intent_position)
        uncertain = tuple(step for step in ordered if step.outcome is None)
        steps: list[ReplayStep] = []
        for step in ordered:
            if step.outcome is None:
                break
            steps.append(step)
        return ReplayPrefix(tuple(steps), uncertain)


def replay_prefix(events: Iterable[RecordedEvent]) -> ReplayPrefix:
    """Fold a run's events (in position order) into its replay prefix."""
    fold = ReplayFold()
    for event in events:
        fold.apply(event)
    return fold.prefix()


class ReplayCursor:
    """Hands recorded outcomes back to a resuming worker, one regenerated intent at a time."""

    def __init__(self, prefix: ReplayPrefix) -> None:
        self._prefix = prefix
        self._next = 0

    @property
    def consumed(self) -> bool:
        return self._next >= len(self._prefix.steps)

    def offer(self, op_id: str, kind: str, tool_contract: str, context: IntentContext) -> ReplayStep | None:
        """The recorded outcome for this intent, or ``None`` once the prefix is consumed.

        ``None`` means: this is a new operation; call the host (after ``require_new_effects_allowed``).
        """
        if self.consumed:
            self.require_new_effects_allowed()
            return None
        step = self._prefix.steps[self._next]
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
        return step

    def require_new_effects_allowed(self) -> None:
        """Refuse new effects until the prefix is consumed and nothing is uncertain."""
        if not self.consumed:
            remaining = len(self._prefix.steps) - self._next
            raise ReplayIncomplete(f"{remaining} recorded operations must be replayed before any new effect")
        if self._prefix.uncertain:
            first = self._prefix.uncertain[0]
            msg = f"operation {first.op_id!r} (position {first.intent_position}) has no recorded outcome: reconcile it"
            raise UncertainIntent(msg)
