"""Generation zero: a handoff's events name the blobs the ledger stores with them, and those blobs
are believed only when they are exactly what the events bind."""

from __future__ import annotations

import hashlib

import msgspec
import pytest

from baton.domain.commands import AcceptHandoff, PrepareHandoff, RenewLease, Submission
from baton.domain.decide import decide
from baton.domain.events import Event, HandoffAccepted, HandoffPrepared, LeaseGranted, RecordedEvent
from baton.domain.generation_zero import StateNotStored, blobs_of, handed_over, migrated_state
from baton.domain.handoff_document import document_digest, encode_document, state_bytes
from baton.domain.state import RunState
from baton.projections.budget_usage import budget_usage

from .handoffs import DESTINATION_STORE, USAGE, claimed_import, document

STATE_PREFIX = b"baton.task-state.v1\x00"


def imported() -> tuple[AcceptHandoff, list[Event], HandoffAccepted]:
    """An import into a store that has never seen the run: the command, its bodies, its acceptance."""
    data = encode_document(document(destination_store=DESTINATION_STORE))
    command = claimed_import(data, document_digest(data), "run-kat")
    bodies = decide(RunState(run_id="run-kat"), Submission("s-1", "run-kat", "w-b", command, 2), 1_000)
    accepted = bodies[0]
    assert isinstance(accepted, HandoffAccepted)
    return command, bodies, accepted


def test_an_import_stores_the_migrated_states_canonical_bytes_under_the_digest_its_event_binds() -> None:
    """Given an import, then its one blob is the state's canonical bytes, keyed by state_ref.digest, whose
    prefixed SHA-256 is the document's state digest; the event names the migration that made it."""
    command, bodies, accepted = imported()
    doc = document()

    blobs = blobs_of(command, bodies)

    assert blobs == {doc.state_digest: state_bytes(doc.state)}
    assert "sha256:" + hashlib.sha256(STATE_PREFIX + blobs[doc.state_digest]).hexdigest() == doc.state_digest
    assert accepted.state_ref.digest == doc.state_digest
    migration = doc.migration
    assert (accepted.migration_id, accepted.from_schema, accepted.from_version) == (
        migration.migration_id,
        migration.from_schema,
        migration.from_version,
    )
    assert (accepted.schema_name, accepted.schema_version, accepted.carried) == ("coding-agent", 2, USAGE)
    assert migrated_state(blobs[doc.state_digest], accepted) == doc.state


def test_a_prepare_stores_the_document_as_submitted_and_other_commands_store_nothing() -> None:
    """Given a prepare's bodies, then its blob is the document's bytes under document_digest; a lease renewal
    (any other command) has none."""
    data = encode_document(document())
    prepared = HandoffPrepared(document_digest(data), document().destination, "run-kat@7", "m", None)

    blobs = blobs_of(PrepareHandoff(data.decode()), [prepared])

    assert blobs == {document_digest(data): data}
    assert handed_over(data, prepared) == data
    assert blobs_of(RenewLease(), [LeaseGranted("w", 1, document().destination, 5)]) == {}


@pytest.mark.parametrize(
    "stored",
    [
        None,  # lost
        b'{"goal":"other"}\n',  # another state
        b'{"attempts": 1}\n',  # not canonical
        b"not json",
        b"[]\n",
    ],
)
def test_a_blob_that_is_missing_or_not_the_bound_state_is_never_believed(stored: bytes | None) -> None:
    """Given the blob under an acceptance's state digest missing or holding other bytes, then StateNotStored."""
    accepted = imported()[2]

    with pytest.raises(StateNotStored):
        migrated_state(stored, accepted)


def test_an_acceptance_stored_before_generation_zero_says_its_state_was_never_stored() -> None:
    """Given an acceptance without the migration fields (an older event) and no blob, then the error says so."""
    accepted = imported()[2]
    older = msgspec.structs.replace(
        accepted, migration_id=msgspec.UNSET, from_schema=msgspec.UNSET, from_version=msgspec.UNSET
    )

    with pytest.raises(StateNotStored, match="accepted before Baton stored the migrated state"):
        migrated_state(None, older)


def test_a_document_blob_that_is_not_the_prepared_document_is_refused() -> None:
    """Given other bytes under a prepared document's digest, then StateNotStored."""
    data = encode_document(document())
    prepared = HandoffPrepared(document_digest(data), document().destination, "run-kat@7", "m", None)

    with pytest.raises(StateNotStored):
        handed_over(data + b" ", prepared)


def _recorded(body: object, position: int, worker: str = "w-b") -> RecordedEvent:
    return RecordedEvent(
        run_id="run-kat", position=position, epoch=2, worker=worker, submission_id=f"s-{position}",
        body=body, recorded_at=86_400_000_000, prev_digest="", digest="",
    )  # type: ignore[arg-type]  # fmt: skip


def test_the_budget_fold_counts_usage_carried_into_an_imported_run_and_not_an_in_store_acceptance() -> None:
    """Given an imported HandoffAccepted, then its carried usage is the run's in every dimension; the same
    event accepted within one store (its usage already charged here) adds nothing."""
    accepted = imported()[2]

    fold = budget_usage([_recorded(accepted, 1)])
    in_store = budget_usage([_recorded(msgspec.structs.replace(accepted, imported=False), 1)])

    assert fold.by("run") == {"run-kat": USAGE}
    assert fold.by("worker") == {"w-b": USAGE} and fold.by("model") == {"": USAGE}
    assert in_store.by("run") == {}
