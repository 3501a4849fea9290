"""The statements a fenced PostgreSQL append runs before its events, and how its failures are named.

Shared by the sync recorder (whose ``_insert_events`` runs them inside the library's append
transaction, before the library's insert) and the asyncio appends. In order: the
run rows' fence (``baton_fence``: row locks, compare-and-set, SQLSTATE ``23F01`` on a miss), the
submission rows, then any riders (data-modifying clauses a caller adds to the same transaction).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import psycopg
from eventsourcing.persistence import IntegrityError, PersistenceError, StoredEvent
from psycopg.abc import QueryNoTemplate
from psycopg.sql import SQL, Identifier

from baton.adapters.eventstore.fenced import (
    AppendConflict,
    DuplicateSubmission,
    FenceViolation,
    Riders,
    SubmissionRow,
    library_error_class,
    sorted_fences,
)
from baton.adapters.eventstore.postgres_schema import APPEND_LOCK, FENCE_COLUMNS, FENCE_SQLSTATE
from baton.domain.fencing import Fence

__all__ = [
    "Statement",
    "append_call",
    "append_params",
    "before_events",
    "blob_insert",
    "events_json",
    "fences_json",
    "library_error",
    "one_run_append",
    "one_run_params",
    "translate",
]

Statement = tuple[QueryNoTemplate, Sequence[Any]]

_json = msgspec.json.Encoder()

# ``json_to_recordset`` reads a missing key as NULL: a renamed field must fail here, loudly.
if tuple(f.name for f in msgspec.structs.fields(Fence)) != tuple(FENCE_COLUMNS):
    raise RuntimeError("Fence's fields changed: update baton_fence's columns (a new migration)")


def before_events(
    schema: str, fences: Sequence[Fence], submissions: Sequence[SubmissionRow], riders: Riders | None
) -> list[Statement]:
    """The statements to run, in order, in the append's transaction before its events are inserted."""
    statements: list[Statement] = [(f"SELECT {APPEND_LOCK}", ())]
    fenced = fences_json(fences)
    if fenced is not None:
        fence = SQL("SELECT {0}.baton_fence(%s::json)").format(Identifier(schema))
        statements.append((fence, (fenced,)))
    if submissions:
        insert = SQL(
            "INSERT INTO {0}.baton_submissions (submission_id, run_id, content_digest, position) "
            "SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::bigint[])"
        ).format(Identifier(schema))
        columns = [list(column) for column in zip(*(msgspec.structs.astuple(row) for row in submissions), strict=True)]
        statements.append((insert, columns))
    if riders is not None:
        clauses, params = riders
        statements.append((f"WITH {clauses} SELECT 1", params))
    return statements


def blob_insert(schema: str, blobs: Mapping[str, bytes]) -> Statement:
    """Store ``blobs`` (digest to bytes) in the append's transaction; one already stored is the same bytes."""
    insert = SQL(
        "INSERT INTO {0}.baton_blobs SELECT * FROM unnest(%s::text[], %s::bytea[]) ON CONFLICT DO NOTHING"
    ).format(Identifier(schema))
    return insert, [list(blobs), list(blobs.values())]


class _EventRow(msgspec.Struct, frozen=True):
    """An event as the append statements read it from JSON (``json_to_recordset``); its state, any
    bytes, travels as base64 and is decoded by the server."""

    originator_id: str
    originator_version: int
    topic: str
    state: bytes


def events_json(events: Sequence[StoredEvent]) -> str:
    """The events of an append as one JSON parameter: one string for psycopg to send, however many."""
    rows = [_EventRow(str(e.originator_id), e.originator_version, e.topic, e.state) for e in events]
    return _json.encode(rows).decode()


def one_run_append(schema: str, events_table: str, *, read_fence: bool = False) -> str:
    """The usual append (one submission's events on a run that exists, no riders) as one plain statement.

    The compare-and-set of the run row feeds the submission row and the events: when it misses, no
    row comes back and nothing is written. The append lock is taken before the run row is, as in
    every other append, so two appends cannot wait on each other in opposite orders. With
    ``read_fence``, a second run row (the principal registry's) must also still be as the decision
    read it; it is share-locked, not written.
    """
    read = (
        "baton_read AS (SELECT 1 FROM {schema}.baton_runs, baton_lock WHERE run_id = %(read_run_id)s "
        "AND head = %(read_head)s AND head_digest = %(read_head_digest)s FOR SHARE OF baton_runs), "
        if read_fence
        else ""
    )
    statement = SQL(
        "WITH baton_lock AS (SELECT " + APPEND_LOCK + "), " + read + "baton_fenced AS (UPDATE {schema}.baton_runs "
        "SET head = %(new_head)s, head_digest = %(new_head_digest)s, "
        "epoch = %(new_epoch)s, holder = %(new_holder)s, expires_at = %(new_expires_at)s, stage = %(stage)s, "
        "status = %(status)s FROM " + ("baton_read" if read_fence else "baton_lock") + " WHERE run_id = %(run_id)s "
        "AND head = %(expected_head)s AND head_digest = %(expected_head_digest)s AND epoch = %(expected_epoch)s "
        "AND holder IS NOT DISTINCT FROM %(expected_holder)s RETURNING run_id), "
        "baton_submitted AS (INSERT INTO {schema}.baton_submissions (submission_id, run_id, content_digest, position) "
        "SELECT %(submission_id)s, run_id, %(content_digest)s, %(position)s FROM baton_fenced) "
        "INSERT INTO {schema}.{table} (originator_id, originator_version, topic, state) "
        "SELECT baton_fenced.run_id, e.originator_version, e.topic, decode(e.state, 'base64') FROM baton_fenced, "
        "json_to_recordset(%(events)s::json) AS e(originator_version bigint, topic text, state text) "
        "RETURNING notification_id"
    )
    return statement.format(schema=Identifier(schema), table=Identifier(events_table)).as_string(None)


def one_run_params(
    fences: Sequence[Fence], submissions: Sequence[SubmissionRow], events: Sequence[StoredEvent]
) -> dict[str, Any] | None:
    """The parameters of ``one_run_append``, or None when the append is not one it can write: one
    submission, the fence of its run, and at most one more fence that changes nothing (a read)."""
    if len(submissions) != 1 or not 1 <= len(fences) <= 2:
        return None
    submission = submissions[0]
    fence, *reads = sorted(fences, key=lambda f: f.run_id != submission.run_id)
    if fence.run_id != submission.run_id or fence.expected_head == 0:
        return None  # a new run's row is inserted, not compare-and-set: ``append_call`` does that
    if any(not _unchanged(read) for read in reads):
        return None
    if not events or any(e.originator_id != fence.run_id for e in events):
        return None
    params: dict[str, Any] = msgspec.structs.asdict(fence)
    params.update(
        submission_id=submission.submission_id,
        content_digest=submission.content_digest,
        position=submission.position,
        events=events_json(events),
    )
    for read in reads:
        params.update(read_run_id=read.run_id, read_head=read.expected_head, read_head_digest=read.expected_head_digest)
    return params


def _unchanged(fence: Fence) -> bool:
    """A fence that expects a run row and writes it back as it was: a read the append depends on."""
    return (fence.expected_head, fence.expected_head_digest, fence.expected_epoch, fence.expected_holder) == (
        fence.new_head,
        fence.new_head_digest,
        fence.new_epoch,
        fence.new_holder,
    )


def fences_json(fences: Sequence[Fence]) -> str | None:
    """``baton_fence``'s argument: the fences in lock order, or None for an append that fences nothing."""
    if len({f.run_id for f in fences}) != len(fences):
        raise ValueError(f"an append takes one fence per run, not {sorted(f.run_id for f in fences)}")
    return _json.encode(sorted_fences(fences)).decode() if fences else None


def append_call(schema: str) -> QueryNoTemplate:
    """The one statement of an append without riders (``baton_append_events``: fence, submission rows,
    notification, events; notification ids back)."""
    return SQL("SELECT {0}.baton_append_events(%s::json, %s::json, %s::json, %s)").format(Identifier(schema))


def append_params(
    fences: Sequence[Fence], submissions: Sequence[SubmissionRow], events: Sequence[StoredEvent], channel: str
) -> tuple[Any, ...]:
    """The parameters of ``append_call``: fences, submission rows and events as JSON, and the channel."""
    return fences_json(fences), _json.encode(submissions).decode(), events_json(events), channel


def library_error(exc: psycopg.Error) -> PersistenceError:
    """The library's error for a psycopg one (as ``PostgresDatastore.get_connection`` names them),
    integrity errors as the fenced recorders' failures."""
    error = library_error_class(exc, psycopg)(str(exc))
    error.__cause__ = exc
    return translate(error) if isinstance(error, IntegrityError) else error


def translate(exc: IntegrityError) -> IntegrityError:
    """Turn an append's integrity error (its psycopg error as ``__cause__``) into a fenced recorder's failure."""
    cause = exc.__cause__
    if not isinstance(cause, psycopg.Error) or cause.diag is None:
        return exc
    diag = cause.diag
    if cause.sqlstate == FENCE_SQLSTATE:
        row = json.loads(diag.message_detail or "{}")
        run_id = row.get("run_id", "")
        if row.get("head") is None:
            return AppendConflict(f"run {run_id!r} has no run row")
        return FenceViolation(run_id, row["head"], row["epoch"], row["holder"])
    if diag.constraint_name == "baton_submissions_pkey":
        detail = diag.message_detail or ""
        submission_id = detail.split("=(", 1)[-1].rsplit(") already exists", 1)[0]
        return DuplicateSubmission(submission_id)
    return AppendConflict(str(cause))
