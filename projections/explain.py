"""A run at a position, told in plain sentences: what it had done, who owned it, what it could do,
what was uncertain, what a resume would need, and whether the log up to there audits clean.

A pure fold of the first n events (time travel: pass the events up to the position to explain).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Iterable

import msgspec

from baton.domain.budgets import COUNTERS
from baton.domain.events import CheckpointSealed, IntentRecorded, LeaseGranted, Placement, RecordedEvent
from baton.projections.audit import AuditFold
from baton.projections.portable_state import PortableStateFold
from baton.projections.resumability import classify, summary_of

__all__ = ["Explanation", "explain"]

_SHOWN = 5  # list at most this many items (operations, owners) in one sentence


class Explanation(msgspec.Struct, frozen=True):
    run_id: str
    position: int
    sentences: tuple[str, ...]


def _iso(micros: int) -> str:
    return dt.datetime.fromtimestamp(micros / 1e6, tz=dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _n(count: int, noun: str) -> str:
    """``1 intent``, ``2 intents``: nouns here take a plain -s."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _listing(items: list[str]) -> str:
    more = f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
    return ", ".join(items[:_SHOWN]) + more


def explain(events: Iterable[RecordedEvent], run_id: str) -> Explanation:  # noqa: C901, PLR0912, PLR0915
    """Explain the run after ``events`` (its first n events, in position order)."""
    fold = PortableStateFold(run_id)
    audit = AuditFold(run_id)
    kinds: Counter[str] = Counter()
    effects = 0
    owners: list[str] = []
    last: RecordedEvent | None = None
    checkpoint = ""
    for event in events:
        fold.apply(event)
        audit.apply(event)
        kinds[event.type] += 1
        body = event.body
        if isinstance(body, IntentRecorded) and body.kind == "effect":
            effects += 1
        elif isinstance(body, LeaseGranted):
            owners.append(f"{body.worker!r} (epoch {body.epoch})")
        elif isinstance(body, CheckpointSealed):
            checkpoint = f"{body.checkpoint_id!r} at {body.stage}"
        last = event
    if last is None:
        return Explanation(run_id, 0, (f"Run {run_id!r} has no events: it does not exist.",))

    run = fold.run
    sentences = [
        f"At position {last.position} ({last.type}, recorded {_iso(last.recorded_at)} by {last.worker!r}), "
        f"run {run_id!r} was {run.status} in stage {run.stage}, on release {run.release_id!r}."
    ]
    intents = kinds["IntentRecorded"]
    done = (
        f"It had recorded {_n(last.position, 'event')}: {_n(intents, 'intent')} ({_n(effects, 'effect')}, "
        f"{intents - effects} pure), {_n(kinds['ObservationRecorded'], 'observation')}, "
        f"{_n(kinds['IntentReconciled'], 'reconciliation')}, {_n(kinds['TransitionRecorded'], 'stage transition')} "
        f"and {_n(kinds['CheckpointSealed'], 'sealed checkpoint')}"
    )
    sentences.append(done + (f" (the last {checkpoint})." if checkpoint else "."))

    lease = run.lease
    if lease is not None:
        place = lease.placement
        where = ", ".join(
            f"{k} {v}" for k, v in (("model", place.model), ("provider", place.provider), ("region", place.region)) if v
        )
        sentences.append(
            f"It was owned by {lease.worker!r} at epoch {lease.epoch}{f' ({where})' if where else ''}, "
            f"with a lease until {_iso(lease.expires_at)}."
        )
    else:
        sentences.append(f"Nobody owned it: no lease was held (the last epoch was {run.epoch}).")
    if len(owners) > 1:
        sentences.append(f"Ownership had moved {_n(len(owners) - 1, 'time')}: {_listing(owners)}.")

    placement = fold.state.placement
    if lease is not None and placement is not None:
        contracts = ", ".join(placement.tool_contracts) or "none declared"
        capabilities = ", ".join(placement.capabilities) or "none declared"
        sentences.append(
            f"Only {lease.worker!r} at epoch {lease.epoch} could append; its placement declared tool contracts "
            f"{contracts} and capabilities {capabilities}."
        )
    budget = []
    for name in COUNTERS:
        used, ceiling = getattr(run.usage, name), getattr(run.ceilings, name)
        if ceiling is not None:
            budget.append(f"{name} {used} of {ceiling} ({ceiling - used} left)")
        elif used:
            budget.append(f"{name} {used} (no ceiling)")
    sentences.append(f"Budgets: {'; '.join(budget)}." if budget else "No budget had been used and no ceiling was set.")

    summary = summary_of(fold)
    uncertain = summary.prefix.uncertain
    if uncertain:
        named = [f"{s.op_id!r} ({s.kind}, {s.tool_contract}, intended at {s.intent_position})" for s in uncertain]
        sentences.append(
            f"{_n(len(uncertain), 'intent')} had no recorded outcome and {'was' if len(uncertain) == 1 else 'were'} "
            f"uncertain: {_listing(named)}."
        )
    else:
        sentences.append("Nothing was uncertain: every intent had a recorded outcome.")

    target = Placement("another-worker")
    if placement is not None:
        target = msgspec.structs.replace(placement, worker="another-worker")
    verdict = classify(summary, target, last.recorded_at)
    sentences.append(
        f"A resume by another worker with the same placement would be {verdict.cls}: "
        + "; ".join(verdict.reasons)
        + "."
    )

    problems = audit.finish()
    if problems:
        first = problems[0]
        sentences.append(
            f"The audit of the log up to here found {_n(len(problems), 'problem')}; the first at position "
            f"{first.position}: {first.code} ({first.detail})."
        )
    else:
        sentences.append("The log up to here audits clean: chain, digests, fencing, operations and budgets hold.")
    return Explanation(run_id, last.position, tuple(sentences))
