"""The ports of the event store: what the ledger needs from a fenced recorder, and nothing more.

Both fenced recorders (``FencedSQLiteRecorder``, ``FencedPostgresRecorder``) implement
``FencedRecorder``; the ledger reaches the store only through it. The methods besides the fenced
append are eventsourcing's own ``ApplicationRecorder`` reads, which the recorders inherit.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Protocol, runtime_checkable
from uuid import UUID

from eventsourcing.persistence import Notification, StoredEvent

from baton.adapters.eventstore.fenced import Riders, RunRow, SubmissionRow
from baton.adapters.eventstore.store_identity import StoreIdentity
from baton.domain.fencing import Fence

__all__ = ["AsyncAppender", "FencedRecorder"]


class AsyncAppender(Protocol):
    """The fenced append awaited on an event loop: the same checks in one transaction as the sync one."""

    def ready(self) -> bool:
        """Whether an append on the running loop can start without waiting for a connection."""
        ...

    async def insert_events(
        self,
        stored_events: Sequence[StoredEvent],
        *,
        fences: Sequence[Fence],
        submissions: Sequence[SubmissionRow],
        riders: Riders | None = None,
    ) -> None:
        """Fence and insert, raising what the sync ``FencedRecorder.insert_events`` raises."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class FencedRecorder(Protocol):
    """An application recorder whose append checks fences and records submission ids atomically.

    ``insert_events(events, fences=..., submissions=..., blobs=...)`` locks the run rows of ``fences``
    (in run id order), checks and updates each one, inserts the submission rows, the blobs the events
    reference (digest to bytes, into ``baton_blobs``) and then the events, all in one transaction;
    it raises ``FenceViolation``, ``DuplicateSubmission`` or ``AppendConflict`` (all ``IntegrityError``)
    with nothing stored, and the library's ``OperationalError`` or
    ``InterfaceError`` when the store cannot be reached.
    """

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None: ...

    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]: ...

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]: ...

    def select_run(self, run_id: str) -> RunRow | None: ...

    def select_runs(self) -> list[RunRow]: ...

    def select_submission(self, submission_id: str) -> SubmissionRow | None: ...

    def select_blobs(self, digests: Collection[str]) -> dict[str, bytes]:
        """The blobs stored under ``digests`` (those it has), as written, unchecked."""
        ...

    def select_store_identity(self) -> StoreIdentity | None:
        """The store's identity (``baton_store``), made by ``migrate``; None if its row is gone."""
        ...

    def check_schema(self) -> None:
        """Raise ``SchemaNotReady`` unless the store's schema is the latest this Baton knows."""
        ...

    def migrate(self) -> list[int]:
        """Apply the migrations the store lacks, in order, recording each; the versions applied."""
        ...

    def async_appender(self) -> AsyncAppender | None:
        """Appends from an event loop, or None where the store has none."""
        ...

    def session(self) -> str:
        """The token of this process's liveness session with the store ("" where it has none).

        Opened on first use and kept until ``close``; a lease acquired with it may be taken over
        before its ttl once ``session_alive`` says it ended (docs/operations.md, "Lease liveness").
        """
        ...

    def session_alive(self, token: str) -> bool:
        """Whether the session ``token`` names may still be open: False only when the store can prove
        it ended; a token it cannot judge (malformed, from elsewhere) counts as alive."""
        ...

    def hold_relay(self) -> bool:
        """Whether this process holds the store's event-relay lock, taking it if it is free; held until
        ``close`` or until the store ends the session holding it (docs/operations.md, "Event relay on Kafka")."""
        ...

    def close(self) -> None:
        """Release what the recorder holds beyond the datastore's pool."""
        ...
