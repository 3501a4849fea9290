"""What a worker asks for: the wire schema of a submission.

One JSON object per submission, the same on stdin (``baton submit``), NATS and Kafka. Unknown
keys are rejected so that a typo never silently drops a field. Commands and submissions are
values, untracked by the cycle collector (``gc=False``), as events are (see ``domain.events``).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from baton.domain.budgets import Ceilings, Usage
from baton.domain.events import BlobRef, ChannelWrite, FailureReason, IntentContext, Placement, Role, RunPolicy
from baton.domain.stages import Stage

__all__ = [
    "ADDED_FIELDS",
    "AbortHandoff",
    "AcceptHandoff",
    "AcquireLease",
    "ClaimHandoff",
    "ConfirmHandoff",
    "Command",
    "CompleteRun",
    "DenyApproval",
    "ExpireLease",
    "FailRun",
    "GrantApproval",
    "GrantAuthority",
    "OpenRun",
    "PrepareHandoff",
    "ReconcileIntent",
    "RecordEvidence",
    "RecordIntent",
    "RecordObservation",
    "RecordTransition",
    "ReleaseLease",
    "RenewLease",
    "RevokeAuthority",
    "ReserveStage",
    "ResumeFrom",
    "SealCheckpoint",
    "Submission",
    "Verdict",
    # the principal registry (domain/identity.py)
    "AddPrincipal",
    "ChangeRoles",
    "OpenRegistry",
    "RevokePrincipal",
    # LangGraph threads (domain/threads.py)
    "DeleteThread",
    "HideCheckpoints",
    "PruneThread",
    "PurgeThread",
    "PutCheckpoint",
    "PutWrites",
]


class _Command(msgspec.Struct, frozen=True, tag_field="type", forbid_unknown_fields=True, gc=False):
    pass


class OpenRun(_Command, tag="open_run", frozen=True):
    release_id: str
    schema_name: str
    schema_version: int
    task_ref: BlobRef
    ceilings: Ceilings = Ceilings()
    policy: RunPolicy = RunPolicy()  # added later: see ``ADDED_FIELDS``


class AcquireLease(_Command, tag="acquire_lease", frozen=True):
    placement: Placement
    ttl_ms: int = 30_000
    # the holder's liveness session (docs/operations.md, "Lease liveness"): once the store sees it gone,
    # the lease can be taken over before its ttl. Empty: the lease lasts its ttl whatever happens to the holder.
    session: str = ""  # added later: see ``ADDED_FIELDS``


class RenewLease(_Command, tag="renew_lease", frozen=True):
    ttl_ms: int = 30_000


class ReleaseLease(_Command, tag="release_lease", frozen=True):
    pass


class ExpireLease(_Command, tag="expire_lease", frozen=True):
    """Any worker (or a supervisor) may record that the clock has passed a lease's expiry."""


class ReserveStage(_Command, tag="reserve_stage", frozen=True):
    """Reserve fuel before a stage runs, also when the stage is replayed after a move."""

    stage_id: str
    fuel: int


class RecordIntent(_Command, tag="record_intent", frozen=True):
    op_id: str
    kind: Literal["effect", "pure"]
    tool_contract: str
    context: IntentContext
    idempotency_key: str


class RecordObservation(_Command, tag="record_observation", frozen=True):
    op_id: str
    context_digest: str
    outcome: Literal["ok", "failed"]
    failure_reason: FailureReason | None = None
    result: Any = None
    result_ref: BlobRef | None = None
    usage: Usage = Usage()
    evidence_refs: tuple[str, ...] = ()


class ReconcileIntent(_Command, tag="reconcile_intent", frozen=True):
    op_id: str
    resolution: Literal["applied", "not_applied", "abandoned"]
    evidence: str
    result: Any = None
    result_ref: BlobRef | None = None
    usage: Usage = Usage()


class ResumeFrom(_Command, tag="resume_from", frozen=True):
    """The new holder consumed the replay prefix ending at ``position`` (chain digest ``prefix_digest``)."""

    position: int
    prefix_digest: str


class RecordTransition(_Command, tag="record_transition", frozen=True):
    to_stage: Stage
    state_digest: str
    state_ref: BlobRef | None = None


class SealCheckpoint(_Command, tag="seal_checkpoint", frozen=True):
    checkpoint_id: str
    state_digest: str
    state_ref: BlobRef | None = None


class GrantAuthority(_Command, tag="grant_authority", frozen=True):
    """Someone other than the holder grants the holder (``worker`` at ``epoch``) a capability reference."""

    grant_id: str
    capability: str
    worker: str
    epoch: int
    ttl_ms: int | None = None


class RevokeAuthority(_Command, tag="revoke_authority", frozen=True):
    grant_id: str
    reason: str


class RecordEvidence(_Command, tag="record_evidence", frozen=True):
    """The holder records a verifier's verdict bound to (artifact, workspace snapshot, environment)."""

    evidence_id: str
    artifact_digest: str
    workspace_snapshot: str
    environment: str
    verdict: Literal["pass", "fail"]
    evidence_ref: BlobRef | None = None


class GrantApproval(_Command, tag="grant_approval", frozen=True):
    """An approver (never the holder) approves exactly ``artifact_digest``."""

    approval_id: str
    artifact_digest: str
    scope: str = "commit"
    ttl_ms: int = 3_600_000


class DenyApproval(_Command, tag="deny_approval", frozen=True):
    approval_id: str
    artifact_digest: str
    reason: str


class PrepareHandoff(_Command, tag="prepare_handoff", frozen=True):
    """Bind the run's continuation to ``document`` (canonical handoff JSON) and move the lease to its
    destination at the next epoch, in one append."""

    document: str
    ttl_ms: int = 30_000


class AcceptHandoff(_Command, tag="accept_handoff", frozen=True):
    """The destination takes the run on from ``document``, whose digest a trusted caller expects.

    Against a run this store has never seen, it imports the run (cross-store handoff) and grants the
    destination the lease at the epoch after the source's last one.
    """

    document: str
    expected_digest: str
    ttl_ms: int = 30_000
    # an import of a document naming a destination store: the source's signed claim receipt
    # (``domain.receipts``) and the source store's public key the caller trusts; added later
    receipt: str = ""
    trust: str = ""


class ClaimHandoff(_Command, tag="claim_handoff", frozen=True):
    """In the source store, the destination claims the prepared handoff for ``for_store``: once
    claimed, the run moves there and nowhere else, and the source accepts nothing more of it."""

    document_digest: str
    for_store: str


class ConfirmHandoff(_Command, tag="confirm_handoff", frozen=True):
    """In the source store, the destination says it imported the claimed handoff (at ``position``)."""

    document_digest: str
    position: int


class AbortHandoff(_Command, tag="abort_handoff", frozen=True):
    """Call off a prepared handoff (its destination will not accept it); the holder keeps the run."""

    reason: str


class CompleteRun(_Command, tag="complete_run", frozen=True):
    summary: str = ""


class FailRun(_Command, tag="fail_run", frozen=True):
    reason: str
    detail: str = ""


class PutCheckpoint(_Command, tag="put_checkpoint", frozen=True):
    """The holder records a LangGraph checkpoint whose document blob is already stored."""

    checkpoint_ns: str
    checkpoint_id: str
    document: BlobRef
    parent_checkpoint_id: str | None = None
    run_tag: str = ""


class PutWrites(_Command, tag="put_writes", frozen=True):
    """The holder records a task's pending writes against a checkpoint (values already stored as blobs)."""

    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    writes: tuple[ChannelWrite, ...]
    task_path: str = ""


class DeleteThread(_Command, tag="delete_thread", frozen=True):
    """The holder tombstones the thread: what came before is hidden from reads, never removed from the log."""

    reason: str = ""


class HideCheckpoints(_Command, tag="hide_checkpoints", frozen=True):
    """The holder hides the checkpoints of these LangGraph run ids (``delete_for_runs``)."""

    run_tags: tuple[str, ...]


class PruneThread(_Command, tag="prune_thread", frozen=True):
    strategy: Literal["keep_latest", "delete"] = "keep_latest"


class PurgeThread(_Command, tag="purge_thread", frozen=True):
    """An operator (not necessarily the holder) erases the thread's blobs; a tombstone and an audit record stay."""

    reason: str
    blobs: int
    blobs_digest: str


class OpenRegistry(_Command, tag="open_registry", frozen=True):
    """Open the store's principal registry, once: with its first operator (the submitter, who signs
    with ``public_key``), or as a development store that verifies no signatures."""

    signatures_required: bool
    public_key: str = ""
    existing: dict[str, int] = {}  # runs in the store before it, and their heads: those events are unsigned


class AddPrincipal(_Command, tag="add_principal", frozen=True):
    name: str
    roles: tuple[Role, ...]
    public_key: str


class ChangeRoles(_Command, tag="change_roles", frozen=True):
    name: str
    roles: tuple[Role, ...]


class RevokePrincipal(_Command, tag="revoke_principal", frozen=True):
    name: str


Command = (
    OpenRun
    | AcquireLease
    | RenewLease
    | ReleaseLease
    | ExpireLease
    | ReserveStage
    | RecordIntent
    | RecordObservation
    | ReconcileIntent
    | ResumeFrom
    | RecordTransition
    | SealCheckpoint
    | GrantAuthority
    | RevokeAuthority
    | RecordEvidence
    | GrantApproval
    | DenyApproval
    | PrepareHandoff
    | AcceptHandoff
    | AbortHandoff
    | ClaimHandoff
    | ConfirmHandoff
    | CompleteRun
    | FailRun
    | PutCheckpoint
    | PutWrites
    | DeleteThread
    | HideCheckpoints
    | PruneThread
    | PurgeThread
    | OpenRegistry
    | AddPrincipal
    | ChangeRoles
    | RevokePrincipal
)


# Fields added to a command after submissions without them were stored: while at their default they
# are left out of a submission's content digest, so a retry from an older client is still a duplicate.
ADDED_FIELDS: dict[str, tuple[str, ...]] = {
    "open_run": ("policy",),
    "acquire_lease": ("session",),
    "accept_handoff": ("receipt", "trust"),
}


class Submission(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """A command plus who sends it, under which epoch, with an id that makes retries safe.

    ``worker`` is the submitting principal's name; in a store that verifies identities,
    ``signed_by`` is its public key and ``signature`` its signature (``domain.identity``).
    """

    submission_id: str
    run_id: str
    worker: str
    command: Command
    epoch: int = 0
    signed_by: str = ""
    signature: str = ""


class Verdict(msgspec.Struct, frozen=True, omit_defaults=False):
    """The answer to one submission; ``position`` is the last position it wrote (or wrote before).

    An accepted (or duplicate) intent carries its ``context_digest``: the digest its observation
    must quote, so a worker or a person writing the observation by hand need not compute it.
    """

    submission_id: str | None
    verdict: Literal["accepted", "duplicate", "rejected"]
    run_id: str | None
    reason: str | None = None
    position: int | None = None
    message: str | None = None
    current_epoch: int | None = None
    context_digest: str | None = None
