"""The run's events: immutable facts, each wrapped in a hash-chained envelope.

Evolution rules (see docs/events.md): a new field gets a default; an existing field never changes
type or meaning; a breaking change bumps ``class_version`` and adds an ``upcast_vN_vN+1`` static
method that rewrites the stored dict before decoding. Stored bytes and digests are never rewritten.

Envelopes, bodies and contexts are values: trees, as every decoder makes them. They are made
``gc=False``, so the cycle collector never walks them; the price is that a cycle an in-process
caller builds through one (a context whose arguments hold the context) is never collected. Such a
value has no JSON text either, so it is never stored. Without it a large batch would set off
collections of the young generation, and of the whole heap, for values that hold no cycle.
"""

from __future__ import annotations

import typing
from typing import Any, ClassVar, Literal

import msgspec

from baton.domain.budgets import Ceilings, Usage
from baton.domain.stages import Stage
from baton.domain.values import (
    ROLES,
    BlobRef,
    ChannelWrite,
    FailureReason,
    IntentContext,
    Placement,
    Role,
    RunPolicy,
)

__all__ = [
    "EVENT_TYPES",
    "HandoffClaimed",
    "HandoffConfirmed",
    "ResumedFrom",
    "ApprovalDenied",
    "ApprovalGranted",
    "AuthorityGranted",
    "AuthorityRevoked",
    "EvidenceRecorded",
    "BlobRef",
    "CheckpointSealed",
    "Event",
    "HandoffAborted",
    "HandoffAccepted",
    "HandoffPrepared",
    "IntentContext",
    "IntentReconciled",
    "IntentRecorded",
    "LeaseExpired",
    "LeaseGranted",
    "LeaseReleased",
    "LeaseRenewed",
    "ObservationRecorded",
    "Placement",
    "RecordedEvent",
    "RunCompleted",
    "RunFailed",
    "RunOpened",
    "StageReserved",
    "TransitionRecorded",
    # LangGraph threads (docs/langgraph.md): checkpoints and writes by blob digest, tombstones, erasure
    "ChannelWrite",
    "CheckpointRecorded",
    "CheckpointsHidden",
    "ThreadDeleted",
    "ThreadPruned",
    "ThreadPurged",
    "WritesRecorded",
    # run policy and the principal registry (domain/identity.py)
    "PolicySet",
    "RunPolicy",
    "ROLES",
    "PrincipalAdded",
    "PrincipalRevoked",
    "PrincipalRolesChanged",
    "RegistryOpened",
    "Role",
    "FailureReason",
]


class _Event(msgspec.Struct, frozen=True, tag_field="type", forbid_unknown_fields=True, gc=False):
    class_version: ClassVar[int] = 1


class RunOpened(_Event, tag=True, frozen=True):
    release_id: str
    schema_name: str
    schema_version: int
    task_ref: BlobRef
    ceilings: Ceilings = Ceilings()


class LeaseGranted(_Event, tag=True, frozen=True, omit_defaults=True):  # added fields omitted at default
    worker: str
    epoch: int
    placement: Placement
    expires_at: int
    session: str = ""  # the holder's liveness session, if it declared one (``AcquireLease.session``)


class LeaseRenewed(_Event, tag=True, frozen=True):
    worker: str
    epoch: int
    expires_at: int


class LeaseReleased(_Event, tag=True, frozen=True):
    worker: str
    epoch: int


class LeaseExpired(_Event, tag=True, frozen=True, omit_defaults=True):  # added fields omitted at default
    worker: str
    epoch: int
    expired_at: int
    session_gone: bool = False  # ended before its ttl: the store saw the holder's session gone


class StageReserved(_Event, tag=True, frozen=True):
    """Fuel set aside before a stage runs; never refunded, and reserved again when replayed."""

    stage_id: str
    fuel: int
    charge: Usage


class IntentRecorded(_Event, tag=True, frozen=True):
    op_id: str
    kind: Literal["effect", "pure"]
    tool_contract: str
    context: IntentContext
    context_digest: str
    idempotency_key: str
    charge: Usage


class ObservationRecorded(_Event, tag=True, frozen=True):
    op_id: str
    context_digest: str
    outcome: Literal["ok", "failed"]
    charge: Usage
    failure_reason: FailureReason | None = None
    result: Any = None
    result_ref: BlobRef | None = None
    evidence_refs: tuple[str, ...] = ()


class IntentReconciled(_Event, tag=True, frozen=True):
    op_id: str
    resolution: Literal["applied", "not_applied", "abandoned"]
    evidence: str
    charge: Usage = Usage()
    result: Any = None
    result_ref: BlobRef | None = None
    # the principal who looked (the submitter); unset, and so not in the bytes, in events stored before
    # it was named: an event's bytes never change
    reconciled_by: str | msgspec.UnsetType = msgspec.UNSET


class ResumedFrom(_Event, tag=True, frozen=True):
    """A worker that took the lease over says which replay prefix it consumed: the position of the
    prefix's last event and that event's chain digest (which commits to every event before it)."""

    position: int
    prefix_digest: str


class TransitionRecorded(_Event, tag=True, frozen=True):
    from_stage: Stage
    to_stage: Stage
    state_digest: str
    charge: Usage
    state_ref: BlobRef | None = None


class CheckpointSealed(_Event, tag=True, frozen=True):
    checkpoint_id: str
    stage: Stage
    state_digest: str
    state_ref: BlobRef | None = None


class AuthorityGranted(_Event, tag=True, frozen=True):
    """A capability *reference* (never the credential) for one worker at one epoch; it dies with the epoch."""

    grant_id: str
    capability: str
    worker: str
    epoch: int
    granted_by: str
    expires_at: int | None = None


class AuthorityRevoked(_Event, tag=True, frozen=True):
    grant_id: str
    reason: str


class EvidenceRecorded(_Event, tag=True, frozen=True):
    """A verifier's verdict on exactly one artifact, in one workspace snapshot and environment."""

    evidence_id: str
    artifact_digest: str
    workspace_snapshot: str
    environment: str
    verdict: Literal["pass", "fail"]
    evidence_ref: BlobRef | None = None


class ApprovalGranted(_Event, tag=True, frozen=True):
    """An approver's yes for exactly one artifact digest: it authorizes nothing else."""

    approval_id: str
    artifact_digest: str
    approver: str
    scope: str
    expires_at: int


class ApprovalDenied(_Event, tag=True, frozen=True):
    approval_id: str
    artifact_digest: str
    approver: str
    reason: str


class HandoffPrepared(_Event, tag=True, frozen=True):
    """The source bound the run's continuation to a document; the lease moves in the same append."""

    document_digest: str
    destination: Placement
    checkpoint_id: str
    migration_id: str
    predecessor_digest: str | None = None
    # the store the document hands the run to (a cross-store handoff); unset, and not in the bytes,
    # for a handoff within this store and in events stored before stores were named
    destination_store: str | msgspec.UnsetType = msgspec.UNSET


class HandoffAccepted(_Event, tag=True, frozen=True):
    """The destination took the run on from exactly this document, before any work of its own.

    ``imported`` marks the first event of a run continued in another store: the event then opens
    the run there with the document's release, migrated schema, ceilings and carried usage.

    This is generation zero: the ledger stores the migrated state's canonical bytes in the same
    append, in the blob store under ``state_ref.digest`` (its ``state_digest_of``), so this store's
    log alone is enough to resume (``domain.generation_zero``). The migration that made the state
    is named too, from ``from_schema`` v``from_version`` to ``schema_name`` v``schema_version``.
    """

    document_digest: str
    source_epoch: int
    release_id: str
    schema_name: str
    schema_version: int
    state_ref: BlobRef
    carried: Usage
    ceilings: Ceilings
    stage: Stage
    imported: bool = False
    predecessor_digest: str | None = None
    # unset, and so not in the bytes, in events stored before generation zero named the migration
    # (whose state was not stored either): an event's bytes never change
    migration_id: str | msgspec.UnsetType = msgspec.UNSET
    from_schema: str | msgspec.UnsetType = msgspec.UNSET
    from_version: int | msgspec.UnsetType = msgspec.UNSET


class HandoffClaimed(_Event, tag=True, frozen=True):
    """The source's record that the prepared handoff moves to ``for_store``, and only there: the
    claim receipt the source store signs quotes this event's position."""

    document_digest: str
    for_store: str


class HandoffConfirmed(_Event, tag=True, frozen=True):
    """The destination's word that it imported the claimed handoff, at ``position`` of its log."""

    document_digest: str
    store_id: str
    position: int


class HandoffAborted(_Event, tag=True, frozen=True):
    """A prepared handoff that will not be accepted; the run stays with the current lease holder."""

    document_digest: str
    reason: str


class RunCompleted(_Event, tag=True, frozen=True):
    summary: str = ""


class RunFailed(_Event, tag=True, frozen=True):
    reason: str
    detail: str = ""


class CheckpointRecorded(_Event, tag=True, frozen=True):
    """A LangGraph checkpoint of this thread: the document (checkpoint, metadata, channel digests) is a blob."""

    checkpoint_ns: str
    checkpoint_id: str
    document: BlobRef
    parent_checkpoint_id: str | None = None
    run_tag: str = ""  # LangGraph's run id (metadata "run_id"), for delete_for_runs


class WritesRecorded(_Event, tag=True, frozen=True):
    """Pending writes of one task against one checkpoint; each value is a blob."""

    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    writes: tuple[ChannelWrite, ...]
    task_path: str = ""


class ThreadDeleted(_Event, tag=True, frozen=True):
    """A tombstone: every checkpoint and write before it is hidden from reads (the log keeps them)."""

    reason: str = ""


class CheckpointsHidden(_Event, tag=True, frozen=True):
    """Checkpoints (and their writes) of these LangGraph run ids are hidden from reads."""

    run_tags: tuple[str, ...]


class ThreadPruned(_Event, tag=True, frozen=True):
    """Checkpoints up to ``upto`` are hidden: all of them, or all but the latest per namespace."""

    strategy: Literal["keep_latest", "delete"]
    upto: int


class ThreadPurged(_Event, tag=True, frozen=True):
    """The audit record of an erasure: the blobs referenced before ``upto`` were deleted from the store.

    ``blobs`` and ``blobs_digest`` (over the sorted digests erased) say what went; the events stay.
    """

    upto: int
    reason: str
    blobs: int
    blobs_digest: str


class PolicySet(_Event, tag=True, frozen=True):
    """The run's policy, recorded right after ``RunOpened`` when it opens with one."""

    policy: RunPolicy


class RegistryOpened(_Event, tag=True, frozen=True):
    """The registry's first event: whether the store verifies signatures, and its first operator."""

    signatures_required: bool
    operator: str = ""
    public_key: str = ""
    # the runs the store held before, and their heads: their events up to there are unsigned; every
    # other event must be signed (an audit reads this, not clocks, to tell which events need signatures)
    existing: dict[str, int] = {}


class PrincipalAdded(_Event, tag=True, frozen=True):
    name: str
    roles: tuple[Role, ...]
    public_key: str


class PrincipalRolesChanged(_Event, tag=True, frozen=True):
    name: str
    roles: tuple[Role, ...]


class PrincipalRevoked(_Event, tag=True, frozen=True):
    name: str


Event = (
    RunOpened
    | LeaseGranted
    | LeaseRenewed
    | LeaseReleased
    | LeaseExpired
    | StageReserved
    | IntentRecorded
    | ObservationRecorded
    | IntentReconciled
    | TransitionRecorded
    | CheckpointSealed
    | AuthorityGranted
    | AuthorityRevoked
    | EvidenceRecorded
    | ApprovalGranted
    | ApprovalDenied
    | HandoffPrepared
    | HandoffAccepted
    | HandoffAborted
    | RunCompleted
    | RunFailed
    | CheckpointRecorded
    | WritesRecorded
    | ThreadDeleted
    | CheckpointsHidden
    | ThreadPruned
    | ThreadPurged
    | PolicySet
    | RegistryOpened
    | PrincipalAdded
    | PrincipalRolesChanged
    | PrincipalRevoked
    | ResumedFrom
    | HandoffClaimed
    | HandoffConfirmed
)

EVENT_TYPES: dict[str, type[_Event]] = {cls.__name__: cls for cls in typing.get_args(Event)}
"""Every event body class by its stored ``type``: the ``Event`` union, read once."""


class RecordedEvent(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True, gc=False):
    """The envelope that is stored: who wrote what, where in the run, chained to its predecessor.

    ``digest`` covers every other field (see ``domain.chain``); ``recorded_at`` is microseconds since
    the epoch, taken from the store's injected clock, never from the worker.
    """

    run_id: str
    position: int
    epoch: int
    worker: str
    submission_id: str
    recorded_at: int
    prev_digest: str
    body: Event
    digest: str  # "" until sealed
    # who signed the submission these events answer (``domain.identity``): the digest of its signed
    # bytes and the signature over it. Empty (unsigned), they are omitted (``omit_defaults``), so an
    # unsigned envelope has the bytes envelopes had before signatures
    signed_digest: str = ""
    signature: str = ""
    # the first event of a signed submission keeps what was signed (``identity.signed_content``), so
    # an auditor can check offline that the events are what their author asked for
    signed_submission: dict[str, Any] | None = None

    @property
    def type(self) -> str:
        return type(self.body).__name__
