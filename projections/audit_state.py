"""What the audit knows about a run while it folds the run's history, and the problems it names.

``AuditState`` is the whole memory of the fold for one run: the head of the ownership and budget
rules, the *open* intents, the pending and last accepted handoff, the live grants of the current
epoch and, per artifact digest, the approval in force and the latest verifier evidence. Settled
operations are forgotten, so the state stays small however long the run.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from baton.domain.budgets import COUNTERS
from baton.domain.events import RecordedEvent, RunPolicy
from baton.domain.stages import Stage
from baton.domain.state import Approval, Evidence, Grant

__all__ = [
    "CODES",
    "AuditState",
    "LeaseRecord",
    "OpRecord",
    "PendingHandoff",
    "Problem",
    "Rule",
]

CODES: dict[str, str] = {
    # the chain and the envelope
    "undecodable": "the stored bytes are not an envelope of a known event",
    "digest_mismatch": "an event's digest does not match its content (altered bytes)",
    "noncanonical": 'the digest holds, but a value is spelled otherwise than its canonical form ("1e0" for 1)',
    "broken_link": "an event's prev_digest is not the digest of the position before it",
    "position_gap": "positions are missing (deleted events)",
    "position_duplicate": "a position occurs twice",
    "position_swap": "two adjacent events are stored in each other's place",
    "position_out_of_order": "a position lower than one already read",
    "wrong_run": "the envelope names another run",
    "head_mismatch": "the log's head differs from the run row (cut-off tail, or rows added behind the ledger)",
    # the store's other rows, and an export's signed head statement
    "submission_past_head": "a submission row points past the log's head (a tail cut, the run row fixed up)",
    "submission_mismatch": "the log's last events are not those of the last submission the ledger accepted",
    "run_row_mismatch": "the run row's epoch, holder, lease expiry, stage or status is not what the log gives",
    "head_unsigned": "an export without the store's head statement (verified with --trust)",
    "head_signature_invalid": "an export's head statement whose signature does not verify with the store's key",
    "tail_cut": "an export whose run ends before the head the store stated",
    "head_unstated": "an export holding a run its head statement does not name",
    # the run's life
    "not_opened": "an event before RunOpened",
    "duplicate_open": "RunOpened again, or an imported HandoffAccepted that is not the run's first event",
    "after_terminal": "an event after RunCompleted or RunFailed",
    "after_claim": "an event in the source after its handoff was claimed for another store (but HandoffConfirmed)",
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
    "uncertain_intent": "a new effect, seal, handoff or completion while intents were uncertain",
    # stages and budgets
    "illegal_transition": "a stage move decide refuses (or completing while COMMITTING)",
    "stage_mismatch": "a transition or checkpoint that names a stage the run was not in",
    "budget_decreased": "a negative charge: usage went down",
    "budget_exceeded": "usage passed a ceiling",
    "counter_overflow": "usage passed 2^63-1",
    # handoffs
    "handoff_pending": "work by the lease holder while a prepared handoff was neither accepted nor aborted",
    "handoff_mismatch": "a handoff acceptance or abort that does not match the prepared handoff it answers",
    "second_successor": "a handoff accepted again, or accepted with none prepared: a second successor",
    # authority, approvals and evidence
    "grant_unbound": "an authority grant for a worker and epoch other than the live lease's",
    "self_authorization": "a grant, an approval decision or verifier evidence from the lease holder itself",
    "authority_missing": "an effect naming a grant not live for its worker and epoch, or a revocation of none",
    "approval_mismatch": "an effect committing a proposal without an unexpired approval for exactly its digest",
    "reverification_required": "an effect committing a proposal without passing evidence in its workspace and release",
    "approval_missing": "an effect the run's policy needs approved, without a live approval of exactly its proposal",
    "evidence_missing": "an effect the run's policy needs verified, without passing evidence of exactly its proposal",
    # authorship (a store whose registry verifies identities)
    "unsigned": "an event without a signature, recorded after the registry required them",
    "unknown_principal": "an event signed for a name the registry did not hold at that time",
    "principal_revoked": "an event from a principal recorded after its revocation",
    "bad_signature": "an event whose signature does not verify with its author's registered key",
    "signed_content_mismatch": "a signed event that is not what its signed submission asked for",
    # derived data
    "snapshot_mismatch": "a stored resume snapshot that is not the fold of the log at its position",
    # reporting
    "too_many_problems": "reporting stopped for this run; more problems may follow",
}


class Problem(msgspec.Struct, frozen=True):
    run_id: str
    position: int
    code: str
    detail: str


# The records are Structs, not NamedTuples: one is made per intent, and a Struct is built (and its
# fields read) in C; gc=False because they hold only strings and ints.


class OpRecord(msgspec.Struct, frozen=True, gc=False):
    kind: str
    context_digest: str
    epoch: int
    position: int


class LeaseRecord(msgspec.Struct, frozen=True, gc=False):
    worker: str
    epoch: int
    expires_at: int
    session: str = ""  # the holder's liveness session: the store may end the lease early once it is gone


class PendingHandoff(msgspec.Struct, frozen=True, gc=False):
    """A prepared handoff: its digest, where it moves the run, and the append that prepared it."""

    digest: str
    destination: str
    epoch: int
    position: int
    submission_id: str


class AuditState:
    """What the rules know about the run before the event at ``position``; they keep it current."""

    __slots__ = (
        "approvals",
        "claimed",
        "dropped",
        "epoch",
        "erasing",
        "evidence",
        "exceeded",
        "grants",
        "handoff",
        "lease",
        "limit",
        "limits",
        "open_by_epoch",
        "opened",
        "operations",
        "pending",
        "policy",
        "position",
        "problems",
        "release_id",
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
        self.release_id = ""
        self.terminal: int | None = None
        self.claimed: int | None = None  # the HandoffClaimed: the run lives in another store from there
        self.erasing: int | None = None  # a purge's tombstone after the end, until its ThreadPurged
        self.stage = Stage.GENERATING
        self.epoch = 0
        self.lease: LeaseRecord | None = None
        self.usage = [0] * len(COUNTERS)
        self.limits: tuple[tuple[int, int], ...] = ()  # (counter index, ceiling)
        self.exceeded: set[int] = set()
        self.operations: dict[str, OpRecord] = {}  # open intents only: a settled one is forgotten
        self.open_by_epoch: dict[int, int] = {}
        self.pending: PendingHandoff | None = None
        self.handoff: tuple[str, int] | None = None  # the last accepted handoff: (digest, position)
        self.grants: dict[str, Grant] = {}  # live grants of the current epoch, by grant id
        self.approvals: dict[str, Approval] = {}  # by artifact digest: the approval in force
        self.evidence: dict[str, Evidence] = {}  # by artifact digest: the latest verdict
        self.policy = RunPolicy()
        self.problems: list[Problem] = []

    @property
    def handoff_digest(self) -> str | None:
        return self.handoff[0] if self.handoff else None

    def holds(self, worker: str, epoch: int) -> bool:
        """Whether ``worker`` holds the current lease at ``epoch`` (what passing the fence needs)."""
        return self.lease is not None and (self.lease.worker, self.lease.epoch) == (worker, epoch)

    def report(self, code: str, detail: str, position: int | None = None) -> None:
        if len(self.problems) >= self.limit:
            self.dropped += 1
            return
        self.problems.append(Problem(self.run_id, self.position if position is None else position, code, detail))


Rule = Callable[[AuditState, RecordedEvent], None]
