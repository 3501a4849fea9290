"""The portable run state: a checkpoint of references, rebuilt from the log at any position.

Everything a resuming worker needs is here as a reference with a digest (task state, observation
manifest, operation ledger, budget ledger, placement), never as process memory. The checkpoint
hash covers the whole document, so two folds agree exactly when their hashes do.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from baton.domain.canonical import canonical_bytes, digest_of
from baton.domain.checkpoint import PortableState
from baton.domain.events import (
    BlobRef,
    CheckpointSealed,
    EvidenceRecorded,
    HandoffAccepted,
    IntentReconciled,
    IntentRecorded,
    LeaseGranted,
    ObservationRecorded,
    Placement,
    RecordedEvent,
    RunOpened,
    TransitionRecorded,
)
from baton.domain.state import RunState, apply
from baton.projections.replay import ReplayFold, ReplayWindow

__all__ = ["PortableState", "PortableStateFold", "ResumeState", "fresh_resume_state", "portable_state"]

_CHECKPOINT_PREFIX = b"baton.checkpoint.v1\x00"
_MANIFEST_PREFIX = b"baton.observation-manifest.v2\x00"
_LEDGER_PREFIX = b"baton.operation-ledger.v2\x00"
_BUDGET_PREFIX = b"baton.budget-ledger.v1\x00"
_AUTHORITY_PREFIX = b"baton.authority-context.v1\x00"


class ResumeState(msgspec.Struct):
    """Everything a resume folds from the log, in one encodable value: what a snapshot stores.

    Its size depends on the open operations and the tool contracts in use, never on the run's
    length: settled operations are counted and digested, not kept.
    """

    run: RunState
    replay: ReplayWindow = msgspec.field(default_factory=ReplayWindow)
    task_ref: BlobRef | None = None
    task_digest: str = ""
    manifest: str = ""
    placement: Placement | None = None
    tool_contracts: set[str] = set()
    evidence_ref: BlobRef | None = None


def fresh_resume_state(run_id: str = "") -> ResumeState:
    """An empty resume state; its run state tracks no op ids or keys (only ``decide`` needs them)."""
    return ResumeState(RunState(run_id=run_id, op_ids=None, used_keys=None))


_state_encoder = msgspec.msgpack.Encoder(order="deterministic")
_state_decoder = msgspec.msgpack.Decoder(ResumeState)


class PortableStateFold:
    """Incremental fold: ``apply`` events in position order, ``snapshot()`` at any point.

    Its whole state is a ``ResumeState``, so ``to_bytes``/``from_bytes`` give snapshots that a
    resume continues from, folding only the events after the snapshot's position.
    """

    def __init__(self, run_id: str = "", state: ResumeState | None = None) -> None:
        self.state = state if state is not None else fresh_resume_state(run_id)
        self.replay = ReplayFold(self.state.replay)

    @property
    def run(self) -> RunState:
        return self.state.run

    def apply(self, event: RecordedEvent) -> None:
        state = self.state
        if not state.run.run_id:
            state.run.run_id = event.run_id
        apply(state.run, event)
        self.replay.apply(event)
        body = event.body
        kind = type(body)
        if kind is IntentRecorded or kind is ObservationRecorded or kind is IntentReconciled:
            if kind is IntentRecorded:
                state.tool_contracts.add(body.tool_contract)  # type: ignore[union-attr]
            # the latest operation event's position and digest: its digest chains to every event
            # before it, so it commits to every intent, outcome and reconciliation (their evidence)
            # in log order; hashed once, when a snapshot is taken, not once per event
            state.manifest = f"{event.position}:{event.digest}"
        elif isinstance(body, RunOpened):
            state.task_ref, state.task_digest = body.task_ref, body.task_ref.digest
        elif isinstance(body, TransitionRecorded | CheckpointSealed):
            state.task_ref, state.task_digest = body.state_ref, body.state_digest
        elif isinstance(body, HandoffAccepted):  # the destination continues from the migrated state
            state.task_ref, state.task_digest = body.state_ref, body.state_ref.digest
        elif isinstance(body, LeaseGranted):
            state.placement = body.placement
        elif isinstance(body, EvidenceRecorded) and body.evidence_ref is not None:
            state.evidence_ref = body.evidence_ref

    def to_bytes(self) -> bytes:
        return _state_encoder.encode(self.state)

    @classmethod
    def from_bytes(cls, data: bytes) -> PortableStateFold:
        return cls(state=_state_decoder.decode(data))

    def snapshot(self) -> PortableState:
        run = self.run
        authority = [run.epoch, run.holder, sorted(run.grants.items())]  # grants are references, never secrets
        manifest = digest_of(_MANIFEST_PREFIX, self.state.manifest.encode())
        draft = PortableState(
            run_id=run.run_id,
            position=run.version,
            checkpoint_id=f"{run.run_id}@{run.version}",
            release_id=run.release_id,
            state_schema_name=run.schema_name,
            state_schema_version=run.schema_version,
            stage=str(run.stage),
            status=run.status,
            task_state_ref=self.state.task_ref,
            task_state_digest=self.state.task_digest,
            observation_manifest_ref=manifest,
            # the operation ledger is what the manifest commits to, read as the list of operations
            operation_ledger_ref=digest_of(_LEDGER_PREFIX, manifest.encode()),
            authority_context_ref=digest_of(_AUTHORITY_PREFIX, canonical_bytes(authority)),
            budget_ledger_ref=digest_of(_BUDGET_PREFIX, canonical_bytes([run.usage, run.ceilings])),
            usage=run.usage,
            ceilings=run.ceilings,
            placement=self.state.placement,
            owner_epoch=run.epoch,
            owner=run.holder,
            last_sealed_checkpoint=run.last_checkpoint_id,
            head_digest=run.head_digest,
            verifier_evidence_ref=self.state.evidence_ref,
        )
        return msgspec.structs.replace(draft, checkpoint_hash=digest_of(_CHECKPOINT_PREFIX, canonical_bytes(draft)))


def portable_state(events: Iterable[RecordedEvent], run_id: str = "") -> PortableState:
    """The portable state after ``events`` (time travel: pass the first n events for position n)."""
    fold = PortableStateFold(run_id)
    for event in events:
        fold.apply(event)
    return fold.snapshot()
