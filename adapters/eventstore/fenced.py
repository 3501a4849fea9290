"""What both fenced recorders share: the append arguments and the ways an append can fail.

These failures are raised *inside* the append transaction, so when one is raised nothing of the
submission has been stored: the rollback takes the run row, the submission ids and the events.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import eventsourcing.persistence
import msgspec
from eventsourcing.persistence import IntegrityError, PersistenceError

from baton.domain.fencing import Fence

__all__ = [
    "MAX_EVENTS_PER_APPEND",
    "AppendConflict",
    "DuplicateSubmission",
    "FenceViolation",
    "Riders",
    "RunRow",
    "SubmissionRow",
    "fence_missed",
    "library_error_class",
    "sorted_fences",
]

# Postgres notification ids are (transaction id << 16) + ordinal: one append holds at most this many.
MAX_EVENTS_PER_APPEND = 65_535

# Data-modifying ``name AS (...)`` clauses and their parameters that ride in an append's statement.
Riders = tuple[str, Sequence[Any]]


class SubmissionRow(msgspec.Struct, frozen=True):
    submission_id: str
    run_id: str
    content_digest: str
    position: int


class RunRow(msgspec.Struct, frozen=True):
    """The run row the fence locks: also a cheap listing of runs for ``baton runs``."""

    run_id: str
    head: int
    head_digest: str
    epoch: int
    holder: str | None
    expires_at: int | None
    stage: str
    status: str


class FenceViolation(IntegrityError):
    """The run row did not match the fence's expectations; carries what it held instead."""

    def __init__(self, run_id: str, head: int, epoch: int, holder: str | None) -> None:
        super().__init__(f"fence violated on run {run_id!r}: head {head}, epoch {epoch}, holder {holder!r}")
        self.run_id = run_id
        self.head = head
        self.epoch = epoch
        self.holder = holder


class DuplicateSubmission(IntegrityError):
    def __init__(self, submission_id: str) -> None:
        super().__init__(f"submission {submission_id!r} was already recorded")
        self.submission_id = submission_id


class AppendConflict(IntegrityError):
    """A position or run id was taken concurrently; reload and decide again."""


def sorted_fences(fences: Sequence[Fence]) -> list[Fence]:
    """Lock run rows in one global order, so two multi-run appends cannot deadlock."""
    return sorted(fences, key=lambda f: f.run_id)


def fence_missed(run_id: str, current: Sequence[Any] | None) -> IntegrityError:
    """What an append whose compare-and-set missed raises, given the run row's (head, epoch, holder)."""
    if current is None:
        return AppendConflict(f"run {run_id!r} has no run row")
    return FenceViolation(run_id, current[0], current[1], current[2])


# PEP 249's exception names, which sqlite3, psycopg and eventsourcing's persistence module all use;
# ``DatabaseError`` last, as the others but ``InterfaceError`` derive from it.
_DB_API_ERRORS = (
    "InterfaceError",
    "DataError",
    "OperationalError",
    "IntegrityError",
    "InternalError",
    "ProgrammingError",
    "NotSupportedError",
    "DatabaseError",
)


def library_error_class(exc: BaseException, driver: ModuleType) -> type[PersistenceError]:
    """The library's error class for a driver's error, as its own datastores raise them: the same name."""
    for name in _DB_API_ERRORS:
        if isinstance(exc, getattr(driver, name)):
            error: type[PersistenceError] = getattr(eventsourcing.persistence, name)
            return error
    return PersistenceError
