"""The audit: a pure fold that re-checks a run's whole history and names every problem it finds.

The ledger refuses bad appends; the audit assumes nothing about how the rows got there (a bug, a
restored backup, someone with database access) and checks the stored log itself: the hash chain
(each digest with ``domain.chain.envelope_digest``, each link, contiguous positions), then, per
event, the rules ``decide`` enforces on the way in: fencing (epoch and lease holder), operations
(every outcome answers an open intent of the same run with the same context digest), budgets
(charges never negative, no ceiling passed), stages, and nothing after a terminal event.

Each problem has a stable ``code`` (``CODES``; docs/audit.md). Checks of an event are small rules
looked up by its body's type (``RULES``): a new event type plugs in with its own rules. The fold
streams: its memory is constant per run apart from the open intents (and at most ``max_problems``
problems), so a run of any length can be audited.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import msgspec

from domain.budgets import COUNTERS, MAX_COUNTER, Usage
from domain.canonical import ZERO_DIGEST
from domain.chain import envelope_digest
from domain.decide import context_digest
from domain.events import (
    CheckpointSealed,
    IntentReconciled,
    IntentRecorded,
    LeaseExpired,
    LeaseGranted,
    LeaseReleased,
    LeaseRenewed,
    ObservationRecorded,
    RecordedEvent,
    RunCompleted,
    RunFailed,
    RunOpened,
    StageReserved,
    TransitionRecorded,
)
from domain.stages import Stage, is_legal

__all__ = ["CODES", "RULES", "AuditFold", "AuditState", "Problem", "Rule", "audit_events", "audit_stored"]

CODES: dict[str, str] = {
    # the chain and the envelope
    "undecodable": "the stored bytes are not an envelope of a known event",
    "digest_mismatch": "an event's digest does not match its content (altered bytes)",
    "broken_link": "an event's prev_digest is not the digest of the position before it",
    "position_gap": "positions are missing (deleted events)",
    "position_duplicate": "a position occurs twice",
    "position_swap": "two adjacent events are stored in each other's place",
    "position_out_of_order": "a position lower than one already read",
    "wrong_run": "the envelope names another run",
    "head_mismatch": "the log's head differs from the run row (cut-off tail, or rows added behind the ledger)",
    # the run's life
    "not_opened": "an event before RunOpened",
    "duplicate_open": "RunOpened again",
    "after_terminal": "an event after RunCompleted or RunFailed",
    # ownership
    "stale_epoch": "an event from an epoch below the run's current epoch",
    "not_lease_holder": "a fenced event from a worker that did not hold the lease at its epoch",
    "lease_expired": "a fenced event recorded at or after its lease's expiry",
    "lease_held": "a lease granted while another lease was live",
    "epoch_not_increasing": "a lease grant that does not advance the epoch, or an envelope epoch that differs",
    "lease_mismatch": "a lease renewal, release or expiry that does not name the current lease",
    "premature_expiry": "a lease recorded as expired before its expiry time",
    # operations
    "duplicate_operation": "an intent for an operation that already has an open intent",
    "context_digest_mismatch": "an intent's context_digest is not the digest of its context",
    "unknown_operation": "an observation or reconciliation without an open intent in this run",
    "context_mismatch": "an observation quoting a context digest its intent did not record",
    "reconciliation_required": "an observation of an intent from an earlier epoch (only reconciliation may settle it)",
    "uncertain_intent": "a new effect, seal or completion while intents were uncertain",
    # stages and budgets
    "illegal_transition": "a stage move decide refuses (or completing while COMMITTING)",
    "stage_mismatch": "a transition or checkpoint that names a stage the run was not in",
    "budget_decreased": "a negative charge: usage went down",
    "budget_exceeded": "usage passed a ceiling",
    "counter_overflow": "usage passed 2^63-1",
    "too_many_problems": "reporting stopped for this run; more problems may follow",
}


class Problem(msgspec.Struct, frozen=True):
    run_id: str
    position: int
    code: str
    detail: str


class _Op(NamedTuple):
    kind: str
    context_digest: str
    epoch: int
    position: int


class _Lease(NamedTuple):
    worker: str
    epoch: int
    expires_at: int


class AuditState:
    """What the rules know about the run before the event at ``position``; they keep it current."""

    __slots__ = (
        "dropped",
        "epoch",
        "exceeded",
        "lease",
        "limit",
        "limits",
        "open_by_epoch",
        "opened",
        "operations",
        "position",
        "problems",
        "run_id",
        "stage",
        "terminal",
        "usage",
    )

    def __init__(self, run_id: str, limit: int = 1000) -> None:
        self.run_id = run_id
        self.limit = limit
        self.dropped = 0
        self.position = 0
        self.opened = False
        self.terminal: int | None = None
        self.stage = Stage.GENERATING
        self.epoch = 0
        self.lease: _Lease | None = None
        self.usage = [0] * len(COUNTERS)
        self.limits: tuple[tuple[int, int], ...] = ()  # (counter index, ceiling)
        self.exceeded: set[int] = set()
        self.operations: dict[str, _Op] = {}  # open intents only: a settled one is forgotten
        self.open_by_epoch: dict[int, int] = {}
        self.problems: list[Problem] = []

    def report(self, code: str, detail: str, position: int | None = None) -> None:
        if len(self.problems) >= self.limit:
            self.dropped += 1
            return
        self.problems.append(Problem(self.run_id, self.position if position is None else position, code, detail))


Rule = Callable[[AuditState, RecordedEvent], None]


# -- rules for every event ----------------------------------------------------------------------


def _lifecycle(s: AuditState, e: RecordedEvent) -> None:
    if s.terminal is not None:
        s.report("after_terminal", f"{e.type} after the run ended at position {s.terminal}")
    if not s.opened and not isinstance(e.body, RunOpened):
        s.report("not_opened", f"{e.type} before RunOpened")
    if e.epoch < s.epoch:
        s.report("stale_epoch", f"{e.type} from {e.worker!r} at epoch {e.epoch}; the run was at epoch {s.epoch}")


def _fenced(s: AuditState, e: RecordedEvent) -> None:
    """The fence ``decide`` applies: the submitter holds the live lease of the current epoch."""
    lease = s.lease
    if e.epoch < s.epoch:
        return  # already reported as stale_epoch
    if lease is None or lease.worker != e.worker or lease.epoch != e.epoch:
        held = f"{lease.worker!r} held epoch {lease.epoch}" if lease else f"no lease was held (epoch {s.epoch})"
        s.report("not_lease_holder", f"{e.type} from {e.worker!r} at epoch {e.epoch}, but {held}")
    elif e.recorded_at >= lease.expires_at:
        s.report(
            "lease_expired",
            f"{e.type} recorded at {e.recorded_at}; lease epoch {lease.epoch} expired at {lease.expires_at}",
        )


def _charge(s: AuditState, e: RecordedEvent) -> None:
    charge: Usage = e.body.charge  # type: ignore[union-attr]  # only registered for bodies with a charge
    amounts = msgspec.structs.astuple(charge)
    if min(amounts) < 0:
        for index, amount in enumerate(amounts):
            if amount < 0:
                s.report("budget_decreased", f"{COUNTERS[index]} charged {amount}")
        amounts = tuple(max(amount, 0) for amount in amounts)
    usage = s.usage = [a + b for a, b in zip(s.usage, amounts, strict=True)]
    if max(usage) > MAX_COUNTER:
        for index, total in enumerate(usage):
            if total > MAX_COUNTER and total - amounts[index] <= MAX_COUNTER:  # reported when it first passes
                s.report("counter_overflow", f"{COUNTERS[index]} reached {total}")
    for index, ceiling in s.limits:
        if usage[index] > ceiling and index not in s.exceeded:
            s.exceeded.add(index)  # reported once per counter: every later event would repeat it
            s.report("budget_exceeded", f"{COUNTERS[index]} {usage[index]} > ceiling {ceiling}")


# -- rules per event type -----------------------------------------------------------------------


def _opened(s: AuditState, e: RecordedEvent) -> None:
    body: RunOpened = e.body  # type: ignore[assignment]
    if s.opened:
        s.report("duplicate_open", "the run was already opened")
        return
    s.opened = True
    s.limits = tuple(
        (index, ceiling) for index, ceiling in enumerate(msgspec.structs.astuple(body.ceilings)) if ceiling is not None
    )


def _granted(s: AuditState, e: RecordedEvent) -> None:
    body: LeaseGranted = e.body  # type: ignore[assignment]
    if s.lease is not None:
        s.report("lease_held", f"epoch {body.epoch} granted while {s.lease.worker!r} held epoch {s.lease.epoch}")
    if body.epoch <= s.epoch or e.epoch != body.epoch:
        s.report(
            "epoch_not_increasing",
            f"grant of epoch {body.epoch} (envelope epoch {e.epoch}) after epoch {s.epoch}",
        )
    s.epoch = max(s.epoch, body.epoch)
    s.lease = _Lease(body.worker, body.epoch, body.expires_at)


def _lease_named(s: AuditState, e: RecordedEvent) -> bool:
    body: LeaseRenewed | LeaseReleased | LeaseExpired = e.body  # type: ignore[assignment]
    lease = s.lease
    if lease is None or (body.worker, body.epoch) != (lease.worker, lease.epoch):
        current = f"{lease.worker!r} at epoch {lease.epoch}" if lease else "no lease"
        s.report("lease_mismatch", f"{e.type} names {body.worker!r} at epoch {body.epoch}; current: {current}")
        return False
    return True


def _renewed(s: AuditState, e: RecordedEvent) -> None:
    body: LeaseRenewed = e.body  # type: ignore[assignment]
    if _lease_named(s, e) and s.lease is not None:
        s.lease = s.lease._replace(expires_at=body.expires_at)


def _released(s: AuditState, e: RecordedEvent) -> None:
    _lease_named(s, e)
    s.lease = None


def _expired(s: AuditState, e: RecordedEvent) -> None:
    body: LeaseExpired = e.body  # type: ignore[assignment]
    if _lease_named(s, e) and s.lease is not None and body.expired_at < s.lease.expires_at:
        s.report("premature_expiry", f"expired at {body.expired_at}, before its expiry {s.lease.expires_at}")
    s.lease = None


def _older_open(s: AuditState) -> list[int]:
    return sorted(epoch for epoch, count in s.open_by_epoch.items() if count and epoch < s.epoch)


def _intent(s: AuditState, e: RecordedEvent) -> None:
    body: IntentRecorded = e.body  # type: ignore[assignment]
    if body.op_id in s.operations:
        s.report(
            "duplicate_operation", f"{body.op_id!r} already has an open intent at {s.operations[body.op_id].position}"
        )
        return
    if body.context_digest != context_digest(body.context):
        s.report("context_digest_mismatch", f"{body.op_id!r} quotes {body.context_digest}")
    if body.kind == "effect" and (older := _older_open(s)):
        s.report("uncertain_intent", f"effect {body.op_id!r} while intents of epochs {older} were uncertain")
    s.operations[body.op_id] = _Op(body.kind, body.context_digest, e.epoch, e.position)
    s.open_by_epoch[e.epoch] = s.open_by_epoch.get(e.epoch, 0) + 1


def _settle(s: AuditState, e: RecordedEvent) -> _Op | None:
    op_id: str = e.body.op_id  # type: ignore[union-attr]
    op = s.operations.pop(op_id, None)
    if op is None:
        s.report("unknown_operation", f"{e.type} for {op_id!r}, which has no open intent in this run")
        return None
    s.open_by_epoch[op.epoch] -= 1
    return op


def _observed(s: AuditState, e: RecordedEvent) -> None:
    body: ObservationRecorded = e.body  # type: ignore[assignment]
    op = _settle(s, e)
    if op is None:
        return
    if op.epoch != e.epoch:
        s.report("reconciliation_required", f"{body.op_id!r} was intended at epoch {op.epoch}, observed at {e.epoch}")
    if body.context_digest != op.context_digest:
        s.report(
            "context_mismatch",
            f"{body.op_id!r} quotes {body.context_digest}; the intent at {op.position} recorded {op.context_digest}",
        )


def _reconciled(s: AuditState, e: RecordedEvent) -> None:
    _settle(s, e)


def _transition(s: AuditState, e: RecordedEvent) -> None:
    body: TransitionRecorded = e.body  # type: ignore[assignment]
    if body.from_stage != s.stage:
        s.report("stage_mismatch", f"transition from {body.from_stage} while the run was in {s.stage}")
    if not is_legal(s.stage, body.to_stage):
        s.report("illegal_transition", f"{s.stage} -> {body.to_stage}")
    s.stage = body.to_stage


def _require_settled(s: AuditState, e: RecordedEvent) -> None:
    if s.operations:
        names = sorted(s.operations)[:5]
        s.report("uncertain_intent", f"{e.type} with {len(s.operations)} uncertain intents, e.g. {names}")


def _sealed(s: AuditState, e: RecordedEvent) -> None:
    body: CheckpointSealed = e.body  # type: ignore[assignment]
    if body.stage != s.stage:
        s.report("stage_mismatch", f"checkpoint at {body.stage} while the run was in {s.stage}")
    _require_settled(s, e)


def _completed(s: AuditState, e: RecordedEvent) -> None:
    _require_settled(s, e)
    if s.stage is Stage.COMMITTING:
        s.report("illegal_transition", "completed while COMMITTING")
    _ended(s, e)


def _ended(s: AuditState, e: RecordedEvent) -> None:
    if s.terminal is None:
        s.terminal = e.position
    s.lease = None


ENVELOPE_RULES: tuple[Rule, ...] = (_lifecycle,)

RULES: dict[type[Any], tuple[Rule, ...]] = {
    RunOpened: (_opened,),
    LeaseGranted: (_granted,),
    LeaseRenewed: (_fenced, _renewed),
    LeaseReleased: (_fenced, _released),
    LeaseExpired: (_expired,),
    StageReserved: (_fenced, _charge),
    IntentRecorded: (_fenced, _charge, _intent),
    ObservationRecorded: (_fenced, _charge, _observed),
    IntentReconciled: (_fenced, _charge, _reconciled),
    TransitionRecorded: (_fenced, _charge, _transition),
    CheckpointSealed: (_fenced, _sealed),
    RunCompleted: (_fenced, _completed),
    RunFailed: (_fenced, _ended),
}
"""Rules per body type, run in order after ``ENVELOPE_RULES``; a type without an entry gets only those."""


# -- the fold -----------------------------------------------------------------------------------


class _Item(NamedTuple):
    position: int
    prev_digest: str
    digest: str
    event: RecordedEvent | None  # None: the bytes did not decode into a known event


_generic = msgspec.json.Decoder()


class AuditFold:
    """Feed a run's events in stored order (``apply_stored`` bytes, or ``apply`` envelopes), then ``finish``.

    ``apply_stored`` checks digests over the stored bytes (read generically, as ``verify_chain``
    does, so upcasting never disturbs them); ``apply`` takes decoded envelopes, whose builtins are
    the stored content for every class at version 1. A canonical export line (integers as decimal
    strings) is read by ``apply_stored`` too.
    """

    def __init__(
        self, run_id: str, *, rules: Mapping[type[Any], Sequence[Rule]] | None = None, max_problems: int = 1000
    ) -> None:
        self.state = AuditState(run_id, max_problems)
        self.events = 0
        self.head = 0  # the last position read in order
        self.head_digest: str | None = ZERO_DIGEST  # None after an undecodable event: the next link is unknown
        self._rules = RULES if rules is None else rules
        self._held: _Item | None = None  # an event after a gap: is the next one the missing position?
        self._finished: list[Problem] | None = None

    @property
    def run_id(self) -> str:
        return self.state.run_id

    def apply_stored(self, data: bytes) -> None:
        """One stored envelope (the events table's bytes, or a line of an export)."""
        self.events += 1
        try:
            envelope = _generic.decode(data)
            if not isinstance(envelope, dict):
                raise TypeError("not an object")
            claimed = envelope.pop("digest")
            position = int(envelope["position"])
        except (msgspec.DecodeError, KeyError, TypeError, ValueError) as exc:
            self.state.report("undecodable", f"undecodable envelope ({exc})", self.head + 1)
            self.head, self.head_digest = self.head + 1, None
            return
        try:
            computed = envelope_digest(envelope)
        except (TypeError, ValueError) as exc:
            computed = f"not canonically encodable ({exc})"
        envelope["digest"] = claimed
        event: RecordedEvent | None
        try:
            event = msgspec.convert(envelope, RecordedEvent, strict=False)
        except msgspec.ValidationError as exc:
            self.state.report("undecodable", f"not a known event ({exc})", position)
            event = None
        self._intake(_Item(position, str(envelope.get("prev_digest")), str(claimed), event), computed)

    def apply(self, event: RecordedEvent) -> None:
        """One decoded envelope; its digest is recomputed from its fields."""
        self.events += 1
        builtins = msgspec.to_builtins(event)
        del builtins["digest"]
        self._intake(_Item(event.position, event.prev_digest, event.digest, event), envelope_digest(builtins))

    def _intake(self, item: _Item, computed: str) -> None:
        if item.digest != computed:
            self.state.report("digest_mismatch", f"stored {item.digest}, computed {computed}", item.position)
        if item.event is not None and item.event.run_id != self.state.run_id:
            self.state.report("wrong_run", f"belongs to run {item.event.run_id!r}", item.position)
        held = self._held
        if held is not None:
            self._held = None
            if item.position == self.head + 1 and held.position == item.position + 1:
                self.state.report(
                    "position_swap",
                    f"positions {item.position} and {held.position} are stored in each other's place",
                    item.position,
                )
                self._in_order(item, linked=True)
                self._in_order(held, linked=True)
                return
            self._gap(held)
        if item.position == self.head + 1:
            self._in_order(item, linked=True)
        elif item.position == self.head:
            self.state.report("position_duplicate", f"position {item.position} again", item.position)
        elif item.position < self.head:
            self.state.report("position_out_of_order", f"position {item.position} after {self.head}", item.position)
        else:
            self._held = item

    def _gap(self, item: _Item) -> None:
        missing = f"{self.head + 1}" if item.position == self.head + 2 else f"{self.head + 1}..{item.position - 1}"
        self.state.report(
            "position_gap", f"position {missing} missing: the log jumps to {item.position}", self.head + 1
        )
        self._in_order(item, linked=False)

    def _in_order(self, item: _Item, *, linked: bool) -> None:
        if linked and self.head_digest is not None and item.prev_digest != self.head_digest:
            self.state.report(
                "broken_link", f"prev_digest {item.prev_digest} is not position {self.head}'s digest", item.position
            )
        self.head, self.head_digest = item.position, item.digest
        event = item.event
        if event is None:
            return
        state = self.state
        state.position = event.position
        for rule in ENVELOPE_RULES:
            rule(state, event)
        for rule in self._rules.get(type(event.body), ()):
            rule(state, event)

    def finish(self, anchor: tuple[int, str] | None = None, *, anchored: bool = False) -> list[Problem]:
        """The problems, by position; ``anchor`` is the run row's (head, head_digest) when there is one.

        With ``anchored`` (the store has run rows) a missing anchor is itself a problem: the
        events of a run the ledger never recorded.
        """
        if self._finished is not None:
            return self._finished
        if self._held is not None:
            held, self._held = self._held, None
            self._gap(held)
        state = self.state
        if anchor is not None and anchor != (self.head, self.head_digest):
            head, digest = anchor
            position = min(self.head, head) + 1 if self.head != head else head  # the first position in doubt
            state.report(
                "head_mismatch",
                f"the log ends at {self.head} ({self.head_digest}); the run row (anchor) records {head} ({digest})",
                max(position, 1),
            )
        elif anchor is None and anchored and self.events:
            state.report("head_mismatch", "the store has no run row for these events", 1)
        problems = sorted(state.problems, key=lambda p: p.position)  # stable: same position keeps its order
        if state.dropped:
            detail = f"{state.dropped} more problems after the first {state.limit} are not listed"
            problems.append(Problem(self.run_id, problems[-1].position, "too_many_problems", detail))
        self._finished = problems
        return problems


def audit_stored(run_id: str, stored: Iterable[bytes], anchor: tuple[int, str] | None = None) -> list[Problem]:
    """The problems of one run given its stored envelopes in stored order."""
    fold = AuditFold(run_id)
    for data in stored:
        fold.apply_stored(data)
    return fold.finish(anchor)


def audit_events(run_id: str, events: Iterable[RecordedEvent], anchor: tuple[int, str] | None = None) -> list[Problem]:
    """The problems of one run given its decoded envelopes in stored order."""
    fold = AuditFold(run_id)
    for event in events:
        fold.apply(event)
    return fold.finish(anchor)
