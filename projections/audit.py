"""The audit: a pure fold that re-checks a run's whole history and names every problem it finds.

The ledger refuses bad appends; the audit assumes nothing about how the rows got there (a bug, a
restored backup, someone with database access) and checks the stored log itself: the hash chain
(each digest with ``domain.chain.envelope_digest``, each link, contiguous positions), then, per
event, the rules ``decide`` enforces on the way in: fencing (epoch and lease holder), operations
(every outcome answers an open intent of the same run with the same context digest), budgets
(charges never negative, no ceiling passed), stages, nothing after a terminal event, handoffs
(exactly the prepared document accepted, once, before any work) and authority (grants, approvals
and evidence bound to the live lease and to exactly the artifact an effect commits). Derived data
the caller hands in is checked against the log too: each stored resume snapshot must be the fold
at its position (``projections.audit_snapshots``).

Each problem has a stable ``code`` (``CODES``; docs/audit.md). Checks of an event are small rules
looked up by its body's type (``RULES``): a new event type plugs in with its own rules. The rules
live in ``projections.audit_rules`` (the run's life, fencing, operations, budgets, stages),
``projections.audit_handoff`` and ``projections.audit_authority``; what they remember is
``projections.audit_state.AuditState``. The fold streams: its memory is constant per run apart
from the open intents and a few small maps (approvals and evidence per artifact), plus at most
``max_problems`` problems, so a run of any length can be audited.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import msgspec

from baton.domain.canonical import ZERO_DIGEST, digest_of, schema_integer
from baton.domain.chain import EVENT_PREFIX, envelope_bytes, envelope_digest, stored_form
from baton.domain.events import (
    ApprovalDenied,
    ApprovalGranted,
    AuthorityGranted,
    AuthorityRevoked,
    CheckpointRecorded,
    CheckpointSealed,
    CheckpointsHidden,
    EvidenceRecorded,
    HandoffAborted,
    HandoffAccepted,
    HandoffClaimed,
    HandoffPrepared,
    IntentReconciled,
    IntentRecorded,
    LeaseExpired,
    LeaseGranted,
    LeaseReleased,
    LeaseRenewed,
    ObservationRecorded,
    PolicySet,
    RecordedEvent,
    RegistryOpened,
    ResumedFrom,
    RunCompleted,
    RunFailed,
    RunOpened,
    StageReserved,
    ThreadDeleted,
    ThreadPruned,
    TransitionRecorded,
    WritesRecorded,
)
from baton.domain.threads import PURGE_TOMBSTONE
from baton.projections import audit_authority as authority
from baton.projections import audit_handoff as handoff
from baton.projections import audit_rules as run
from baton.projections.audit_anchors import LastSubmission, RowClaims, check_rows
from baton.projections.audit_snapshots import SnapshotCheck
from baton.projections.audit_state import CODES, AuditState, Problem, Rule

__all__ = [
    "CODES",
    "Authorship",
    "RULES",
    "AuditFold",
    "AuditState",
    "Problem",
    "Rule",
    "audit_events",
    "audit_stored",
    "fenced_work",
    "tombstone",
]

ENVELOPE_RULES: tuple[Rule, ...] = (run.lifecycle,)

# who wrote an event, checked by whoever holds the registry: a problem's (code, detail), or None
Authorship = Callable[[RecordedEvent], tuple[str, str] | None]

# fenced work, which the holder may not do while a handoff is pending
_WORK: tuple[Rule, ...] = (run.fenced, handoff.not_pending)

_FENCED_WORK = (*ENVELOPE_RULES, *_WORK)


def fenced_work(s: AuditState, e: RecordedEvent) -> None:
    """``run.lifecycle``, ``run.fenced`` and ``handoff.not_pending`` in one rule (the fold puts it in
    their place): for work by the live lease's holder at its epoch, before the lease's expiry, in an
    opened run that has not ended, with no handoff pending (nearly every event), none of them reports
    anything or changes the state; any other event gets the three rules themselves."""
    lease = s.lease
    if (
        lease is not None
        and lease.worker == e.worker
        and lease.epoch == e.epoch
        and e.recorded_at < lease.expires_at
        and e.epoch >= s.epoch
        and s.opened
        and s.terminal is None
        and s.claimed is None
        and s.pending is None
    ):
        return
    run.lifecycle(s, e)
    run.fenced(s, e)
    handoff.not_pending(s, e)


def tombstone(s: AuditState, e: RecordedEvent) -> None:
    """A thread's tombstone is the holder's work, unless it is a purge's: any worker (an operator) may purge."""
    if not e.body.reason.startswith(PURGE_TOMBSTONE):  # type: ignore[union-attr]  # registered for ThreadDeleted
        for rule in _WORK:
            rule(s, e)


RULES: dict[type[Any], tuple[Rule, ...]] = {
    RunOpened: (run.opened,),
    PolicySet: (authority.policy_set,),  # right after RunOpened, in the same (unfenced) submission
    RegistryOpened: (run.opened,),  # the registry stream's first event: an operator's, no lease
    LeaseGranted: (run.granted,),
    LeaseRenewed: (run.fenced, run.renewed),
    LeaseReleased: (run.fenced, run.released),
    LeaseExpired: (run.expired,),
    StageReserved: (*_WORK, run.charge),
    IntentRecorded: (*_WORK, run.charge, run.intent, authority.authorized),
    ObservationRecorded: (*_WORK, run.charge, run.observed),
    IntentReconciled: (*_WORK, run.charge, run.reconciled),
    TransitionRecorded: (*_WORK, run.charge, run.transition),
    CheckpointSealed: (*_WORK, run.checkpoint),
    ResumedFrom: _WORK,  # the new holder's word that it replayed: fenced like its work
    AuthorityGranted: (authority.authority_granted,),
    AuthorityRevoked: (authority.authority_revoked,),
    EvidenceRecorded: (authority.evidence,),  # a verifier's: no lease
    ApprovalGranted: (authority.approval_granted,),
    ApprovalDenied: (authority.approval_denied,),
    HandoffPrepared: (*_WORK, handoff.prepared),
    HandoffAccepted: (handoff.accepted,),  # fenced unless imported: the rule decides
    HandoffAborted: (run.fenced, handoff.aborted),
    HandoffClaimed: (run.fenced, handoff.claimed),  # by the destination worker, which the prepare gave the lease
    RunCompleted: (*_WORK, run.completed),
    RunFailed: (run.fenced, run.ended),
    # a LangGraph thread's checkpoints and writes (adapters/langgraph), the holder's work too
    CheckpointRecorded: _WORK,
    WritesRecorded: _WORK,
    CheckpointsHidden: _WORK,
    ThreadPruned: _WORK,
    ThreadDeleted: (tombstone,),
}
"""Rules per body type, run in order after ``ENVELOPE_RULES``; a type without an entry gets only those."""


# -- the fold -----------------------------------------------------------------------------------


class _Item(NamedTuple):
    position: int
    prev_digest: str
    digest: str
    event: RecordedEvent | None  # None: the bytes did not decode into a known event


_generic = msgspec.json.Decoder()
_typed = msgspec.json.Decoder(RecordedEvent, strict=False)  # the stored form spells integers as strings


def _as_stored(data: bytes) -> tuple[RecordedEvent, str] | None:
    """The event ``data`` holds and its digest by the definition, when ``data`` is exactly that event's
    stored form (its canonical bytes with the digest as a last member); None for any other bytes."""
    try:
        event = _typed.decode(data)
        canonical = envelope_bytes(event)
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError, ValueError):
        return None
    if stored_form(canonical, event.digest) != data:
        return None
    return event, digest_of(EVENT_PREFIX, canonical)


def _canonical_digest(event: RecordedEvent) -> str:
    """The digest of a decoded envelope's fields by the definition, or why it has none."""
    try:
        return digest_of(EVENT_PREFIX, envelope_bytes(event))
    except (TypeError, ValueError) as exc:
        return f"not canonically encodable ({exc})"


class AuditFold:
    """Feed a run's events in stored order (``apply_stored`` bytes, or ``apply`` envelopes), then ``finish``.

    ``apply_stored`` checks digests over the stored bytes (read generically, as ``verify_chain``
    does, so upcasting never disturbs them); ``apply`` takes decoded envelopes, whose builtins are
    the stored content for every class at version 1. A canonical export line (integers as decimal
    strings) is read by ``apply_stored`` too.
    """

    def __init__(
        self,
        run_id: str,
        *,
        rules: Mapping[type[Any], Sequence[Rule]] | None = None,
        max_problems: int = 1000,
        authorship: Authorship | None = None,
        snapshots: Mapping[int, bytes] | None = None,
    ) -> None:
        """``authorship`` checks who wrote each event (its signature against the registry): a
        problem's code and detail, or None. It is given by the caller, which holds the registry and
        the means to verify a signature (``adapters.identity.RegistryHistory``). ``snapshots`` are
        the run's stored resume snapshots (position -> the fold's bytes each claims), compared with
        the fold at their positions (``projections.audit_snapshots``)."""
        self.state = AuditState(run_id, max_problems)
        self._authorship = authorship
        self._snapshots = SnapshotCheck(run_id, snapshots) if snapshots else None
        self.events = 0
        self.head = 0  # the last position read in order
        self.head_digest: str | None = ZERO_DIGEST  # None after an undecodable event: the next link is unknown
        self.head_submission: str | None = None  # the submission of the event at ``head``
        self._rules = RULES if rules is None else rules
        self._chains = {kind: self._chain(kind) for kind in self._rules}  # per body type with rules of its own
        self._held: _Item | None = None  # an event after a gap: is the next one the missing position?
        self._finished: list[Problem] | None = None

    @property
    def run_id(self) -> str:
        return self.state.run_id

    def apply_stored(self, data: bytes) -> None:
        """One stored envelope (the events table's bytes, or a line of an export).

        The bytes are decoded generically and the digest is computed over them by
        ``envelope_digest``, as ``verify_chain`` does; then they are decoded into the typed
        envelope the rules read. Bytes whose digest holds but which are not the canonical bytes of
        that typed envelope (a lenient spelling such as ``"1e0"`` for 1) are ``noncanonical``.

        Bytes that are exactly the stored form of the event they decode to (every envelope the
        ledger writes) are settled by that one encoding: their generic decoding would give the same
        digest. Only other bytes are taken apart, to say what is wrong with them.
        """
        self.events += 1
        stored = _as_stored(data)
        if stored is not None:
            canonical_event, digest = stored
            item = _Item(canonical_event.position, canonical_event.prev_digest, canonical_event.digest, canonical_event)
            self._intake(item, digest)
            return
        try:
            envelope = _generic.decode(data)
            if not isinstance(envelope, dict):
                raise TypeError("not an object")
            claimed = envelope.pop("digest")
            position = schema_integer(envelope["position"])
        except (msgspec.DecodeError, KeyError, TypeError, ValueError) as exc:
            self.state.report("undecodable", f"undecodable envelope ({exc})", self.head + 1)
            self.head, self.head_digest, self.head_submission = self.head + 1, None, None
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
        if event is not None and claimed == computed and _canonical_digest(event) != computed:
            # a lenient spelling (``"1e0"``, ``"-0"``, ``"null"``) under a valid digest: the bytes
            # verify, but they are not the canonical bytes of the event every reader gets from them
            self.state.report("noncanonical", "a value is not spelled as its canonical form", position)
        self._intake(_Item(position, str(envelope.get("prev_digest")), str(claimed), event), computed)

    def apply(self, event: RecordedEvent) -> None:
        """One decoded envelope; its digest is recomputed from its fields."""
        self.events += 1
        self._intake(_Item(event.position, event.prev_digest, event.digest, event), _canonical_digest(event))

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
                self._in_order(*item)
                self._in_order(*held)
                return
            self._gap(held)
        if item.position == self.head + 1:
            self._in_order(*item)
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
        self._in_order(*item, linked=False)

    def _in_order(
        self, position: int, prev_digest: str, digest: str, event: RecordedEvent | None, *, linked: bool = True
    ) -> None:
        if linked and self.head_digest is not None and prev_digest != self.head_digest:
            detail = f"prev_digest {prev_digest} is not position {self.head}'s digest"
            self.state.report("broken_link", detail, position)
        self.head, self.head_digest = position, digest
        if event is None:
            self.head_submission = None
            return
        self.head_submission = event.submission_id
        state = self.state
        state.position = event.position
        for rule in self._chains.get(type(event.body), ENVELOPE_RULES):
            rule(state, event)
        if self._authorship is not None:
            found = self._authorship(event)
            if found is not None:
                state.report(*found)
        if self._snapshots is not None:
            self._snapshots.apply(state, event)

    def _chain(self, kind: type[Any]) -> tuple[Rule, ...]:
        """``ENVELOPE_RULES``, then the body type's rules, with the usual fenced prefix as one rule."""
        chain = (*ENVELOPE_RULES, *self._rules.get(kind, ()))
        if chain[:3] == _FENCED_WORK:
            chain = (fenced_work, *chain[3:])
        return chain

    def finish(
        self,
        anchor: tuple[int, str] | None = None,
        *,
        anchored: bool = False,
        row: RowClaims | None = None,
        submission: LastSubmission | None = None,
    ) -> list[Problem]:
        """The problems, by position; ``anchor`` is the run row's (head, head_digest) when there is one.

        With ``anchored`` (the store has run rows) a missing anchor is itself a problem: the
        events of a run the ledger never recorded; and the store's other rows are compared with the
        log (``projections.audit_anchors``): ``row``, the run row's other columns, and
        ``submission``, the run's last submission row (None: it has none).
        """
        if self._finished is not None:
            return self._finished
        if self._held is not None:
            held, self._held = self._held, None
            self._gap(held)
        state = self.state
        if state.erasing is not None:  # the log ends on a purge's tombstone after the run's end
            run.unfinished_erasure(state, state.erasing)
            state.erasing = None
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
        if anchored:
            agreed = anchor is not None and anchor == (self.head, self.head_digest)
            check_rows(state, self.head, self.head_submission, row if agreed else None, submission)
        if self._snapshots is not None:
            self._snapshots.finish(state, self.head)
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
