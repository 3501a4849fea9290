"""The statements a fenced PostgreSQL append runs before its events, and how its failures are named.

Shared by the sync recorder (whose ``_insert_events`` runs them inside the library's append
transaction, before the library's table lock and insert) and the asyncio appends. In order: the
run rows' fence (``baton_fence``: row locks, compare-and-set, SQLSTATE ``23F01`` on a miss), the
submission rows, then any riders (data-modifying clauses a caller adds to the same transaction).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
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
from baton.adapters.eventstore.postgres_schema import FENCE_COLUMNS, FENCE_SQLSTATE
from baton.domain.fencing import Fence

__all__ = ["Statement", "append_call", "append_params", "before_events", "library_error", "translate"]

Statement = tuple[QueryNoTemplate, Sequence[Any]]

_json = msgspec.json.Encoder()

# ``json_to_recordset`` reads a missing key as NULL: a renamed field must fail here, loudly.
if tuple(f.name for f in msgspec.structs.fields(Fence)) != tuple(FENCE_COLUMNS):
    raise RuntimeError("Fence's fields changed: update baton_fence's columns (a new migration)")


def before_events(
    schema: str, fences: Sequence[Fence], submissions: Sequence[SubmissionRow], riders: Riders | None
) -> list[Statement]:
    """The statements to run, in order, in the append's transaction before its events are inserted."""
    if len({f.run_id for f in fences}) != len(fences):
        raise ValueError(f"an append takes one fence per run, not {sorted(f.run_id for f in fences)}")
    statements: list[Statement] = []
    if fences:
        fence = SQL("SELECT {0}.baton_fence(%s::json)").format(Identifier(schema))
        statements.append((fence, (_json.encode(sorted_fences(fences)).decode(),)))
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


def append_call(schema: str) -> QueryNoTemplate:
    """The one statement of an append without riders (``baton_append_events``: fence, submission rows,
    table lock, notification, events; notification ids back)."""
    return SQL("SELECT {0}.baton_append_events(%s::json, %s::json, %s, %s, %s, %s, %s)").format(Identifier(schema))


def append_params(
    fences: Sequence[Fence], submissions: Sequence[SubmissionRow], events: Sequence[StoredEvent], channel: str
) -> tuple[Any, ...]:
    """The parameters of ``append_call``: the events as four arrays (their states sent as binary ``bytea``)."""
    if len({f.run_id for f in fences}) != len(fences):
        raise ValueError(f"an append takes one fence per run, not {sorted(f.run_id for f in fences)}")
    fenced = _json.encode(sorted_fences(fences)).decode() if fences else None
    ids = [e.originator_id for e in events]
    versions = [e.originator_version for e in events]
    topics = [e.topic for e in events]
    states = [e.state for e in events]
    return fenced, _json.encode(submissions).decode(), ids, versions, topics, states, channel


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
        submission_id = detail.split("=(", 1)[-1].split(")", 1)[0]
        return DuplicateSubmission(submission_id)
    return AppendConflict(str(cause))
