"""The auditor's read of the events table: stored bytes in stored order, a key range at a time.

``baton audit`` checks the bytes as stored, so it reads them generically, without the mapper or
upcasting: ``(run_id, state)`` ordered by run, then by position, in one streaming query (memory
stays flat however large the store). On PostgreSQL the results are binary (``bytea`` arrives as
bytes, not as hex text to unescape) and arrive in chunks of rows where libpq can (17 and later: the
server sends the next chunk while the audit checks this one), else through a server-side cursor, a
page at a time. A key range (``low`` inclusive, ``high`` exclusive, compared by the database, as
its ``ORDER BY`` compares) lets several processes share one store without sharing a run:
``key_ranges`` cuts the run rows into parts of about equal event counts.

The audit compares each stored resume snapshot with the fold at its position: ``snapshot_runs``
lists the runs that have any (one query per key range), ``stored_snapshots`` reads one run's.
It compares each run's last submission row with the log's head too: ``last_submissions`` reads
them for every run (or one) in one query, one row per run.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from itertools import pairwise

from psycopg import pq
from psycopg.rows import tuple_row

from baton.adapters.eventstore import snapshots
from baton.adapters.eventstore.fenced import RunRow
from baton.adapters.eventstore.ledger import RunLedger
from baton.adapters.eventstore.postgres_recorder import FencedPostgresRecorder
from baton.adapters.eventstore.sqlite_recorder import FencedSQLiteRecorder
from baton.projections.audit_anchors import LastSubmission

__all__ = [
    "CHUNKED_ROWS",
    "ITERSIZE",
    "KeyRange",
    "key_ranges",
    "last_submissions",
    "snapshot_runs",
    "stored_rows",
    "stored_snapshots",
]

ITERSIZE = 5000  # rows per page
CHUNKED_ROWS = pq.version() >= 170000  # libpq 17 streams a result in chunks of rows (``Cursor.stream(size=...)``)

KeyRange = tuple[str | None, str | None]
"""``(low, high)``: run ids ``low <= run_id < high``; ``None`` leaves that side open."""


def stored_rows(
    ledger: RunLedger,
    run_id: str | None = None,
    *,
    key_range: KeyRange = (None, None),
    itersize: int = ITERSIZE,
    upto: int | None = None,
) -> Generator[tuple[str, bytes], None, None]:
    """``(run_id, stored bytes)`` of every event (or one run's, or a key range's), by run, then position;
    with ``upto``, only positions up to it (an export, up to the head its run row records)."""
    recorder = ledger.recorder
    if not isinstance(recorder, FencedPostgresRecorder | FencedSQLiteRecorder):
        raise TypeError(f"no audit reader for {type(recorder).__name__}")
    table = recorder.events_table_name
    where, params = _where(run_id, key_range)
    if upto is not None:
        where, params = f"{where} {'AND' if where else 'WHERE'} originator_version <= %s", [*params, upto]
    order = " ORDER BY originator_id, originator_version"
    if isinstance(recorder, FencedPostgresRecorder):
        statement = f'SELECT originator_id, state FROM "{recorder.datastore.schema}"."{table}"{where}{order}'
        if CHUNKED_ROWS:
            # The server sends page after page while the audit checks the last one (a server-side
            # cursor waits for each FETCH): more events per second for less client CPU per row.
            with (
                recorder.datastore.get_connection() as conn,
                conn.transaction(),
                conn.cursor(row_factory=tuple_row, binary=True) as curs,
            ):
                yield from curs.stream(statement, params, size=itersize)
            return
        with (
            recorder.datastore.get_connection() as conn,
            conn.transaction(),
            conn.cursor(name="baton_audit", row_factory=tuple_row, binary=True) as curs,
        ):
            curs.execute(statement, params)
            while rows := curs.fetchmany(itersize):  # a page at a time: cheaper than row-by-row iteration
                yield from rows
        return
    statement = f"SELECT originator_id, state FROM {table}{where.replace('%s', '?')}{order}"
    with recorder.datastore.transaction(commit=False) as wrapped, wrapped as curs:
        curs.execute(statement, params)
        while rows := curs.fetchmany(itersize):
            for originator_id, state in rows:
                yield originator_id, bytes(state)


def key_ranges(runs: Sequence[RunRow], parts: int) -> list[KeyRange]:
    """Cut the runs (in the store's order) into at most ``parts`` ranges of about equal event counts.

    The first range is open below and the last open above, so events of a run with no run row
    are in exactly one range too.
    """
    total = sum(row.head for row in runs)
    bounds: list[str] = []
    done = 0
    for row in runs:
        if len(bounds) == parts - 1:
            break
        if done >= total * (len(bounds) + 1) / parts and (not bounds or bounds[-1] != row.run_id):
            bounds.append(row.run_id)
        done += row.head
    return list(pairwise([None, *bounds, None]))


def snapshot_runs(ledger: RunLedger, run_id: str | None = None, *, key_range: KeyRange = (None, None)) -> set[str]:
    """The runs (all, one, or a key range's) with at least one stored snapshot."""
    recorder = ledger.recorder
    table = ledger.snapshot_recorder.events_table_name  # type: ignore[attr-defined]  # both backends' have one
    where, params = _where(run_id, key_range)
    if isinstance(recorder, FencedPostgresRecorder):
        statement = f'SELECT DISTINCT originator_id FROM "{recorder.datastore.schema}"."{table}"{where}'
        with recorder.datastore.get_connection() as conn, conn.cursor(row_factory=tuple_row) as curs:
            curs.execute(statement, params)
            return {row[0] for row in curs.fetchall()}
    if not isinstance(recorder, FencedSQLiteRecorder):
        raise TypeError(f"no audit reader for {type(recorder).__name__}")
    with recorder.datastore.transaction(commit=False) as curs:
        curs.execute(f"SELECT DISTINCT originator_id FROM {table}{where.replace('%s', '?')}", params)
        return {row[0] for row in curs.fetchall()}


def last_submissions(ledger: RunLedger, run_id: str | None = None) -> dict[str, LastSubmission]:
    """Per run (every run, or one), its submission row with the highest position.

    One scan of ``baton_submissions`` (it has no index by run: one per append would cost every
    append for the audit's sake), sorted by the database, one row per run returned.
    """
    recorder = ledger.recorder
    where, params = _where(run_id, (None, None), column="run_id")
    if isinstance(recorder, FencedPostgresRecorder):
        statement = (
            f'SELECT DISTINCT ON (run_id) run_id, submission_id, position FROM "{recorder.datastore.schema}".'
            f"baton_submissions{where} ORDER BY run_id, position DESC"
        )
        with recorder.datastore.get_connection() as conn, conn.cursor(row_factory=tuple_row) as curs:
            curs.execute(statement, params)
            rows = curs.fetchall()
    elif isinstance(recorder, FencedSQLiteRecorder):
        # SQLite takes the bare columns of a max() aggregate from the row holding the maximum
        statement = f"SELECT run_id, submission_id, max(position) FROM baton_submissions{where} GROUP BY run_id"
        with recorder.datastore.transaction(commit=False) as curs:
            curs.execute(statement.replace("%s", "?"), params)
            rows = curs.fetchall()
    else:
        raise TypeError(f"no audit reader for {type(recorder).__name__}")
    return {run: LastSubmission(submission_id, position) for run, submission_id, position in rows}


def stored_snapshots(ledger: RunLedger, run_id: str) -> dict[int, bytes]:
    """A run's stored snapshots: position -> the fold's bytes each row claims (its tag is not checked:
    the audit compares the claim with the fold itself)."""
    rows = ledger.snapshot_recorder.select_events(run_id)
    return {row.originator_version: snapshots.content(row.topic, row.state) for row in rows}


def _where(run_id: str | None, key_range: KeyRange, *, column: str = "originator_id") -> tuple[str, list[object]]:
    """The ``WHERE`` clause (``%s`` placeholders) for one run or a key range, and its parameters."""
    conditions: list[str] = []
    params: list[object] = []
    if run_id is not None:
        conditions.append(f"{column} = %s")
        params.append(run_id)
    low, high = key_range
    if low is not None:
        conditions.append(f"{column} >= %s")
        params.append(low)
    if high is not None:
        conditions.append(f"{column} < %s")
        params.append(high)
    return (f" WHERE {' AND '.join(conditions)}" if conditions else ""), params
