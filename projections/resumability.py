"""Resumability: the strongest procedure a resume needs, with the reasons, for a proposed target.

Classes (domain.md): R0 not resumable; R1 restart from the previous durable boundary; R2 resume
from deterministic state; R3 replay recorded observations; R4 ownership must transfer (epoch
advances); R5 reconcile side effects of unknown outcome first; MIGRATION_UNSAFE the target cannot
honour the run. R0 and MIGRATION_UNSAFE are decided first and answer alone (a resume that must
not happen needs no procedure); otherwise every numbered rule that applies adds a reason and the
class is the strongest of them. See docs/resumability.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

import msgspec

from baton.domain.events import Placement, RecordedEvent
from baton.domain.state import RunState
from baton.domain.times import utc_text
from baton.projections.portable_state import PortableStateFold
from baton.projections.replay import PrefixOutline

__all__ = [
    "ResumePoint",
    "Resumability",
    "ResumabilityClass",
    "RunSummary",
    "classify",
    "resume_point",
    "summarize",
    "summary_of",
]


class ResumabilityClass(StrEnum):
    R0 = "R0"
    R1 = "R1"
    R2 = "R2"
    R3 = "R3"
    R4 = "R4"
    R5 = "R5"
    MIGRATION_UNSAFE = "MIGRATION_UNSAFE"


_STRENGTH = {cls: rank for rank, cls in enumerate(ResumabilityClass)}


class Resumability(msgspec.Struct, frozen=True):
    cls: ResumabilityClass = msgspec.field(name="class")
    reasons: tuple[str, ...]


class RunSummary(msgspec.Struct, frozen=True):
    """What classification needs from the log, folded once."""

    state: RunState
    prefix: PrefixOutline  # the settled steps are counted, not held
    tool_contracts: frozenset[str]
    placement: Placement | None  # the last lease's placement, kept after the lease ends


class ResumePoint(msgspec.Struct, frozen=True):
    """What ``resume_from`` must name for a worker: the position of the replay prefix's last event
    and its chain digest; ``required``: the ledger refuses that worker's new work until it does."""

    position: int
    prefix_digest: str
    required: bool


def resume_point(state: RunState, worker: str) -> ResumePoint:
    """The prefix ``worker`` owes (or will owe on taking the lease over) and whether it owes one.

    The last holder owes what the ledger froze when the lease passed to it, if it has not said
    ``resume_from`` yet; any other worker would owe the run's work as it stands, once the lease
    passes to it (a run never leased owes nothing).
    """
    if state.last_holder == worker:
        if state.replay_required:
            return ResumePoint(state.prefix_position, state.prefix_digest, required=True)
        return ResumePoint(state.work_position, state.work_digest, required=False)
    return ResumePoint(state.work_position, state.work_digest, required=state.last_holder is not None)


def summarize(events: Iterable[RecordedEvent], run_id: str = "") -> RunSummary:
    fold = PortableStateFold(run_id)
    for event in events:
        fold.apply(event)
    return summary_of(fold)


def summary_of(fold: PortableStateFold) -> RunSummary:
    """The classification input from a fold (possibly continued from a snapshot)."""
    state = fold.state
    run = _copy_run(state.run)
    return RunSummary(run, fold.replay.outline(), frozenset(state.tool_contracts), state.placement)


_run_encoder = msgspec.msgpack.Encoder()
_run_decoder = msgspec.msgpack.Decoder(RunState)


def _copy_run(run: RunState) -> RunState:
    """A deep copy through msgpack: several times faster than ``copy.deepcopy`` for large runs."""
    return _run_decoder.decode(_run_encoder.encode(run))


def classify(summary: RunSummary, target: Placement, now: int) -> Resumability:  # noqa: C901
    """The class and every reason, for resuming ``summary``'s run on ``target`` at time ``now``."""
    state, prefix = summary.state, summary.prefix
    if not state.opened:
        return Resumability(ResumabilityClass.R0, ("the run does not exist",))
    if state.closed:
        return Resumability(ResumabilityClass.R0, (f"the run is {state.status}: nothing to resume",))

    unsafe: list[str] = []
    missing = sorted(summary.tool_contracts - set(target.tool_contracts))
    if missing:
        unsafe.append(f"target lacks tool contracts the run used: {', '.join(missing)}")
    if summary.placement is not None:
        needed = sorted(set(summary.placement.capabilities) - set(target.capabilities))
        if needed:
            unsafe.append(f"target lacks capabilities of the last placement: {', '.join(needed)}")
    if unsafe:
        return Resumability(ResumabilityClass.MIGRATION_UNSAFE, tuple(unsafe))

    found: list[tuple[ResumabilityClass, str]] = []
    effects = [s for s in prefix.uncertain if s.kind == "effect"]
    pure = [s for s in prefix.uncertain if s.kind == "pure"]
    for step in effects:
        found.append(
            (
                ResumabilityClass.R5,
                f"effect {step.op_id!r} (position {step.intent_position}, {step.tool_contract}) has no recorded "
                "outcome: reconcile it before any new effect",
            )
        )
    found += _ownership(state, target, now)
    if prefix.length:
        found.append((ResumabilityClass.R3, f"{prefix.length} recorded outcomes are replayed without calling the host"))
    for step in pure:
        found.append(
            (
                ResumabilityClass.R1,
                f"pure operation {step.op_id!r} (position {step.intent_position}) has no outcome: its work is "
                "discarded and redone from the last boundary",
            )
        )
    if not found:
        return Resumability(ResumabilityClass.R2, (f"deterministic state at {state.stage}: nothing to replay",))
    strongest = max((cls for cls, _ in found), key=_STRENGTH.__getitem__)
    return Resumability(strongest, tuple(reason for _, reason in found))


def _ownership(state: RunState, target: Placement, now: int) -> list[tuple[ResumabilityClass, str]]:
    """R4 reasons: a handoff is in flight, or the epoch must advance for ``target`` to own the run."""
    lease, found = state.lease, []
    if state.pending_handoff is not None:
        holder = lease.worker if lease else "nobody"
        reason = (
            f"handoff {state.pending_handoff} to {holder!r} is prepared: only its destination may accept it, "
            "or the holder aborts it"
        )
        found.append((ResumabilityClass.R4, reason))
    if lease is None:
        found.append(
            (ResumabilityClass.R4, f"no live lease (last epoch {state.epoch}): acquire epoch {state.epoch + 1}")
        )
    elif lease.worker != target.worker or now >= lease.expires_at:
        holder = (
            "expired" if now >= lease.expires_at else f"held by {lease.worker!r} until {utc_text(lease.expires_at)}"
        )
        found.append((ResumabilityClass.R4, f"lease epoch {lease.epoch} is {holder}: the epoch must advance"))
    return found
