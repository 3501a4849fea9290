"""The thread index: a small view of the log that LangGraph reads instead of scanning events.

``baton_lg_threads(run_id, position)`` says how far each run's log is folded in;
``baton_lg_checkpoints`` holds one row per visible checkpoint (its document by digest, metadata as JSON
for filters, and every blob digest it references) and ``baton_lg_writes`` one row per visible
pending write. The writer updates the index right after its append with a compare-and-set on
``position``; whoever finds the index behind the run's head folds the missing events in from the
log (``catch_up``), so a crash between append and index costs one catch-up, never a wrong answer.
Hiding events (tombstones, ``delete_for_runs``, pruning) delete index rows; the log keeps all.

No LangGraph import here: ``baton purge`` and ``baton store init`` use this module without the
optional extra.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

import msgspec

from baton.adapters.eventstore.blobs import BlobStore, SqlConnection
from baton.adapters.langgraph.document import decode_document
from baton.domain.events import (
    CheckpointRecorded,
    CheckpointsHidden,
    Event,
    RecordedEvent,
    ThreadDeleted,
    ThreadPruned,
    ThreadPurged,
    WritesRecorded,
)

__all__ = ["CheckpointRow", "ThreadIndex", "WriteRow", "create_index_tables"]


class CheckpointRow(msgspec.Struct, frozen=True):
    run_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str | None
    position: int
    document: bytes
    run_tag: str = ""


class WriteRow(msgspec.Struct, frozen=True):
    run_id: str
    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    idx: int
    channel: str
    kind: str
    task_path: str
    data: bytes


_DDL = {
    "sqlite": [
        "CREATE TABLE IF NOT EXISTS baton_lg_threads (run_id TEXT PRIMARY KEY, position INTEGER NOT NULL)",
        "CREATE TABLE IF NOT EXISTS baton_lg_checkpoints (run_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL, "
        "checkpoint_id TEXT NOT NULL, parent_id TEXT, position INTEGER NOT NULL, run_tag TEXT NOT NULL, "
        "metadata TEXT NOT NULL, document BLOB NOT NULL, digests TEXT NOT NULL, "
        "PRIMARY KEY (run_id, checkpoint_ns, checkpoint_id))",
        "CREATE TABLE IF NOT EXISTS baton_lg_writes (run_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL, "
        "checkpoint_id TEXT NOT NULL, task_id TEXT NOT NULL, idx INTEGER NOT NULL, channel TEXT NOT NULL, "
        "kind TEXT NOT NULL, digest TEXT NOT NULL, task_path TEXT NOT NULL, position INTEGER NOT NULL, "
        "PRIMARY KEY (run_id, checkpoint_ns, checkpoint_id, task_id, idx))",
        "CREATE INDEX IF NOT EXISTS baton_lg_checkpoints_tag ON baton_lg_checkpoints (run_tag)",
    ],
    "postgresql": [
        "CREATE TABLE IF NOT EXISTS baton_lg_threads (run_id text PRIMARY KEY, position bigint NOT NULL)",
        "CREATE TABLE IF NOT EXISTS baton_lg_checkpoints (run_id text NOT NULL, checkpoint_ns text NOT NULL, "
        "checkpoint_id text NOT NULL, parent_id text, position bigint NOT NULL, run_tag text NOT NULL, "
        "metadata jsonb NOT NULL, document bytea NOT NULL, digests text NOT NULL, "
        "PRIMARY KEY (run_id, checkpoint_ns, checkpoint_id))",
        "CREATE TABLE IF NOT EXISTS baton_lg_writes (run_id text NOT NULL, checkpoint_ns text NOT NULL, "
        "checkpoint_id text NOT NULL, task_id text NOT NULL, idx integer NOT NULL, channel text NOT NULL, "
        "kind text NOT NULL, digest text NOT NULL, task_path text NOT NULL, position bigint NOT NULL, "
        "PRIMARY KEY (run_id, checkpoint_ns, checkpoint_id, task_id, idx))",
        "CREATE INDEX IF NOT EXISTS baton_lg_checkpoints_tag ON baton_lg_checkpoints (run_tag)",
    ],
}
_CP_COLUMNS = "run_id, checkpoint_ns, checkpoint_id, parent_id, position, run_tag, metadata, document, digests"
_W_COLUMNS = "run_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, kind, digest, task_path, position"
# A checkpoint row's document: rows store it empty and read it from its blob, whose digest (sha256:
# and 64 hex digits) opens ``digests``; it is not written twice (rows of older builds still hold it).
_DOCUMENT = (
    "CASE WHEN length(c.document) > 0 THEN c.document ELSE "
    "(SELECT b.data FROM baton_blobs b WHERE b.digest = substr(c.digests, 1, 71)) END"
)


def create_index_tables(conn: SqlConnection) -> None:
    with conn.cursor() as cur:
        for statement in _DDL[conn.backend]:
            cur.execute(statement)


class ThreadIndex:
    """Fold thread events into the index, and answer LangGraph's reads from it."""

    def __init__(self, conn: SqlConnection, blobs: BlobStore) -> None:
        self.conn = conn
        self.blobs = blobs
        self._pg = conn.backend == "postgresql"
        # For operators and tests: folds whose compare-and-set missed (``record`` returned False), and
        # catch-ups from the log. A lone writer's own folds, and the reads after them, add to neither.
        self.cas_misses = 0
        self.catch_ups = 0

    # -- folding ------------------------------------------------------------------------------

    def record(
        self,
        run_id: str,
        expected: int,
        events: Sequence[tuple[int, Event]],
        docs: dict[str, bytes],
        *,
        blobs: dict[str, bytes] | None = None,
        upto: int | None = None,
    ) -> bool:
        """Fold ``events`` (positions after ``expected``) in one transaction if the index is at ``expected``.

        The index then stands at ``upto`` (default: the last event's position; events between that hold
        nothing for the index need not be listed). ``blobs`` are stored whatever the outcome (in the same
        statement in PostgreSQL). False means someone else moved the index (or it lags): call ``catch_up``.
        """
        new = upto if upto is not None else (events[-1][0] if events else expected)
        clauses = self.fold_clauses(run_id, expected, events, docs, upto=new)
        if clauses is not None:
            ctes, params = clauses
            if blobs:
                clause, extra = BlobStore.insert_clause(blobs, "lg_blobs")
                ctes, params = [*ctes, clause], [*params, *extra]
            with self.conn.cursor() as cur:
                row = cur.execute(f"WITH {', '.join(ctes)} SELECT count(*) FROM lg_t", params).fetchone()
            if not row[0]:
                self.cas_misses += 1
            return bool(row[0])
        cp_rows, w_rows, hides = _rows(run_id, events, docs)
        if blobs:
            self.blobs.put(blobs)
        with self.conn.cursor(transaction=True) as cur:
            if expected == 0:
                cur.execute(
                    "INSERT INTO baton_lg_threads VALUES (%s, 0) ON CONFLICT (run_id) DO NOTHING",
                    (run_id,),
                )
            cur.execute(
                "UPDATE baton_lg_threads SET position = %s WHERE run_id = %s AND position = %s", (new, run_id, expected)
            )
            if cur.rowcount != 1:
                self.cas_misses += 1
                return False
            self._apply(cur, run_id, cp_rows, w_rows, hides)
        return True

    def fold_clauses(
        self,
        run_id: str,
        expected: int,
        events: Sequence[tuple[int, Event]],
        docs: dict[str, bytes],
        *,
        upto: int | None = None,
    ) -> tuple[list[str], list[Any]] | None:
        """PostgreSQL: the common fold (checkpoints, writes) as data-modifying ``WITH`` clauses and their
        parameters, to run as one statement or inside an append (``lg_t`` returns the run id when the
        compare-and-set hit). None when the fold needs several statements (hiding events; SQLite)."""
        if not self._pg:
            return None
        cp_rows, w_rows, hides = _rows(run_id, events, docs)
        if hides:
            return None
        new = upto if upto is not None else (events[-1][0] if events else expected)
        if expected == 0:  # no row yet is the same as position 0
            ctes = [
                "lg_t AS (INSERT INTO baton_lg_threads VALUES (%s, %s) ON CONFLICT (run_id) DO UPDATE SET "
                "position = excluded.position WHERE baton_lg_threads.position = 0 RETURNING run_id)"
            ]
            params: list[Any] = [run_id, new]
        else:
            ctes = [
                "lg_t AS (UPDATE baton_lg_threads SET position = %s WHERE run_id = %s AND position = %s "
                "RETURNING run_id)"
            ]
            params = [new, run_id, expected]
        if len(cp_rows) == 1:  # the common case, with scalar parameters (arrays cost client CPU to dump)
            ctes.append(
                f"lg_c AS (INSERT INTO baton_lg_checkpoints ({_CP_COLUMNS}) SELECT lg_t.run_id, %s, %s, %s, "
                "%s::bigint, %s, %s::jsonb, %s::bytea, %s FROM lg_t ON CONFLICT (run_id, checkpoint_ns, "
                "checkpoint_id) DO UPDATE SET parent_id = excluded.parent_id, position = excluded.position, "
                "run_tag = excluded.run_tag, metadata = excluded.metadata, document = excluded.document, "
                "digests = excluded.digests)"
            )
            params += cp_rows[0][1:]
        elif cp_rows:
            ctes.append(
                f"lg_c AS (INSERT INTO baton_lg_checkpoints ({_CP_COLUMNS}) SELECT lg_t.run_id, u.* FROM lg_t, "
                "unnest(%s::text[], %s::text[], %s::text[], %s::bigint[], %s::text[], %s::jsonb[], %s::bytea[], "
                "%s::text[]) AS u ON CONFLICT (run_id, checkpoint_ns, checkpoint_id) DO UPDATE SET "
                "parent_id = excluded.parent_id, position = excluded.position, run_tag = excluded.run_tag, "
                "metadata = excluded.metadata, document = excluded.document, digests = excluded.digests)"
            )
            params += [list(column) for column in list(zip(*cp_rows, strict=True))[1:]]
        for name, rows, conflict in (
            ("lg_w", [r for r in w_rows if r[4] >= 0], "DO NOTHING"),
            (
                "lg_s",
                [r for r in w_rows if r[4] < 0],
                "DO UPDATE SET channel = excluded.channel, kind = excluded.kind, digest = excluded.digest, "
                "task_path = excluded.task_path, position = excluded.position",
            ),
        ):
            if rows:
                ctes.append(
                    f"{name} AS (INSERT INTO baton_lg_writes ({_W_COLUMNS}) SELECT lg_t.run_id, u.* FROM lg_t, "
                    "unnest(%s::text[], %s::text[], %s::text[], %s::int[], %s::text[], %s::text[], %s::text[], "
                    "%s::text[], %s::bigint[]) AS u "
                    f"ON CONFLICT (run_id, checkpoint_ns, checkpoint_id, task_id, idx) {conflict})"
                )
                params += [list(column) for column in list(zip(*rows, strict=True))[1:]]
        return ctes, params

    def _apply(
        self, cur: Any, run_id: str, cp_rows: list[tuple[Any, ...]], w_rows: list[tuple[Any, ...]], hides: list[Any]
    ) -> None:
        if cp_rows:
            cur.executemany(
                f"INSERT INTO baton_lg_checkpoints ({_CP_COLUMNS}) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s) "
                "ON CONFLICT (run_id, checkpoint_ns, checkpoint_id) DO UPDATE SET parent_id = excluded.parent_id, "
                "position = excluded.position, run_tag = excluded.run_tag, metadata = excluded.metadata, "
                "document = excluded.document, digests = excluded.digests",
                cp_rows,
            )
        plain = [row for row in w_rows if row[4] >= 0]
        special = [row for row in w_rows if row[4] < 0]  # ERROR, INTERRUPT ...: the latest one wins
        if plain:
            cur.executemany(
                f"INSERT INTO baton_lg_writes ({_W_COLUMNS}) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) "
                "ON CONFLICT (run_id, checkpoint_ns, checkpoint_id, task_id, idx) DO NOTHING",
                plain,
            )
        if special:
            cur.executemany(
                f"INSERT INTO baton_lg_writes ({_W_COLUMNS}) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) "
                "ON CONFLICT (run_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET "
                "channel = excluded.channel, kind = excluded.kind, digest = excluded.digest, "
                "task_path = excluded.task_path, position = excluded.position",
                special,
            )
        for position, body in hides:
            self._hide(cur, run_id, position, body)

    def _hide(self, cur: Any, run_id: str, position: int, body: Any) -> None:
        if isinstance(body, ThreadDeleted | ThreadPurged):
            cur.execute("DELETE FROM baton_lg_checkpoints WHERE run_id = %s AND position < %s", (run_id, position))
        elif isinstance(body, CheckpointsHidden):
            tags = list(body.run_tags)
            cur.execute(
                f"DELETE FROM baton_lg_checkpoints WHERE run_id = %s AND position < %s "
                f"AND run_tag IN ({self.conn.in_list(tags)})",
                (run_id, position, *tags),
            )
        elif isinstance(body, ThreadPruned):
            keep = (
                ""
                if body.strategy == "delete"
                else " AND checkpoint_id < (SELECT max(c2.checkpoint_id) FROM baton_lg_checkpoints c2 "
                "WHERE c2.run_id = baton_lg_checkpoints.run_id "
                "AND c2.checkpoint_ns = baton_lg_checkpoints.checkpoint_ns)"
            )
            cur.execute(
                f"DELETE FROM baton_lg_checkpoints WHERE run_id = %s AND position <= %s{keep}", (run_id, body.upto)
            )
        # writes go with their checkpoints
        cur.execute(
            "DELETE FROM baton_lg_writes WHERE run_id = %s AND position < %s AND NOT EXISTS (SELECT 1 FROM "
            "baton_lg_checkpoints c WHERE c.run_id = baton_lg_writes.run_id AND c.checkpoint_ns = "
            "baton_lg_writes.checkpoint_ns AND c.checkpoint_id = baton_lg_writes.checkpoint_id)",
            (run_id, position),
        )

    def catch_up(self, run_id: str, history: Callable[[int], Iterable[RecordedEvent]]) -> None:
        """Fold the log's events after the indexed position; ``history(after)`` reads them."""
        self.catch_ups += 1
        for _ in range(16):  # another reader may be folding the same events: then read again
            expected = self.position(run_id)
            events = [(e.position, e.body) for e in history(expected)]
            wanted = [body.document.digest for _, body in events if isinstance(body, CheckpointRecorded)]
            if self.record(run_id, expected, events, self.blobs.get(wanted)):
                return

    # -- reading ------------------------------------------------------------------------------

    def position(self, run_id: str) -> int:
        with self.conn.cursor() as cur:
            row = cur.execute("SELECT position FROM baton_lg_threads WHERE run_id = %s", (run_id,)).fetchone()
            return int(row[0]) if row else 0

    def heads(self, run_id: str) -> tuple[int | None, int]:
        """The run's head in the log (None: no such run) and how far the index has folded it."""
        with self.conn.cursor() as cur:
            row = cur.execute(
                "SELECT (SELECT head FROM baton_runs WHERE run_id = %s), "
                "(SELECT position FROM baton_lg_threads WHERE run_id = %s)",
                (run_id, run_id),
            ).fetchone()
        return (None if row[0] is None else int(row[0])), int(row[1] or 0)

    def lookup(self, run_id: str, ns: str, checkpoint_id: str | None) -> tuple[int | None, int, CheckpointRow | None]:
        """Heads plus one checkpoint row (the latest of ``ns`` without an id), in one round trip."""
        where = "c.checkpoint_id = %s" if checkpoint_id else "TRUE"
        params: list[Any] = [run_id, run_id, run_id, ns]
        if checkpoint_id:
            params.append(checkpoint_id)
        with self.conn.cursor() as cur:
            row = cur.execute(
                f"SELECT h.head, h.indexed, c.checkpoint_id, c.parent_id, c.position, {_DOCUMENT} FROM "
                "(SELECT (SELECT head FROM baton_runs WHERE run_id = %s) AS head, "
                "(SELECT position FROM baton_lg_threads WHERE run_id = %s) AS indexed) h LEFT JOIN "
                f"(SELECT * FROM baton_lg_checkpoints c WHERE c.run_id = %s AND c.checkpoint_ns = %s AND {where} "
                "ORDER BY c.checkpoint_id DESC LIMIT 1) c ON TRUE",
                params,
            ).fetchone()
        head = None if row[0] is None else int(row[0])
        # no row, or its document blob purged (the tombstone not folded in yet): nothing to show
        found = None if row[5] is None else CheckpointRow(run_id, ns, row[2], row[3], int(row[4]), bytes(row[5]))
        return head, int(row[1] or 0), found

    def checkpoints(
        self,
        run_id: str | None,
        *,
        ns: str | None = None,
        checkpoint_id: str | None = None,
        before: str | None = None,
        metadata: dict[str, Any] | None = None,
        limit: int | None = None,
        oldest_first: bool = False,
    ) -> list[CheckpointRow]:
        clauses: list[str] = []
        params: list[Any] = []
        for column, value in (("run_id", run_id), ("checkpoint_ns", ns), ("checkpoint_id", checkpoint_id)):
            if value is not None:
                clauses.append(f"{column} = %s")
                params.append(value)
        if before is not None:
            clauses.append("checkpoint_id < %s")
            params.append(before)
        for key, value in (metadata or {}).items():
            if self._pg:
                clauses.append("metadata @> %s::jsonb")
                params.append(msgspec.json.encode({key: value}).decode())
            else:
                clauses.append("json_extract(metadata, %s) IS json_extract(%s, '$')")
                params += ['$."' + key.replace('"', '""') + '"', msgspec.json.encode(value).decode()]
        where = " AND ".join(clauses) or "TRUE"
        order = "position" if oldest_first else "checkpoint_id DESC"
        tail = f" LIMIT {int(limit)}" if limit is not None else ""
        with self.conn.cursor() as cur:
            rows = cur.execute(
                f"SELECT run_id, checkpoint_ns, checkpoint_id, parent_id, position, {_DOCUMENT}, run_tag "
                f"FROM baton_lg_checkpoints c WHERE {where} ORDER BY {order}{tail}",
                params,
            ).fetchall()
        return [CheckpointRow(r[0], r[1], r[2], r[3], int(r[4]), bytes(r[5]), r[6]) for r in rows if r[5] is not None]

    def load(
        self, digests: Collection[str], checkpoint_ids: Collection[str]
    ) -> tuple[dict[str, bytes], list[WriteRow]]:
        """Channel blobs by digest and the pending writes (with their values) of these checkpoints, in one query."""
        digests, checkpoint_ids = list(digests), list(checkpoint_ids)
        with self.conn.cursor() as cur:
            rows = cur.execute(
                "SELECT 0, digest, data, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM baton_blobs "
                f"WHERE digest IN ({self.conn.in_list(digests)}) UNION ALL "
                "SELECT 1, w.run_id, b.data, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.idx, w.channel, w.kind, "
                "w.task_path FROM baton_lg_writes w JOIN baton_blobs b ON b.digest = w.digest "
                f"WHERE w.checkpoint_id IN ({self.conn.in_list(checkpoint_ids)})",
                [*digests, *checkpoint_ids],
            ).fetchall()
        blobs: dict[str, bytes] = {}
        writes: list[WriteRow] = []
        for r in rows:
            if r[0] == 0:
                blobs[r[1]] = bytes(r[2])
            else:
                writes.append(WriteRow(r[1], r[3], r[4], r[5], int(r[6]), r[7], r[8], r[9], bytes(r[2])))
        return blobs, writes

    def writes_of(self, run_id: str) -> list[tuple[str, str, str, int, str, str, str, str]]:
        """Every visible write of a run as stored (digests, not values), in position order: for copies."""
        with self.conn.cursor() as cur:
            rows = cur.execute(
                "SELECT checkpoint_ns, checkpoint_id, task_id, idx, channel, kind, digest, task_path "
                "FROM baton_lg_writes WHERE run_id = %s ORDER BY position, task_id, idx",
                (run_id,),
            ).fetchall()
        return [tuple(r) for r in rows]

    def runs_tagged(self, run_tags: Collection[str]) -> list[str]:
        tags = list(run_tags)
        with self.conn.cursor() as cur:
            rows = cur.execute(
                f"SELECT DISTINCT run_id FROM baton_lg_checkpoints WHERE run_tag IN ({self.conn.in_list(tags)})", tags
            ).fetchall()
        return sorted(r[0] for r in rows)

    def digests_in_use(self, *, except_run: str) -> set[str]:
        """Every blob a visible checkpoint or write of another run references (a purge keeps these)."""
        used: set[str] = set()
        with self.conn.cursor() as cur:
            for (digests,) in cur.execute(
                "SELECT digests FROM baton_lg_checkpoints WHERE run_id <> %s", (except_run,)
            ).fetchall():
                used.update(digests.split())
            rows = cur.execute("SELECT digest FROM baton_lg_writes WHERE run_id <> %s", (except_run,)).fetchall()
            used.update(r[0] for r in rows)
        return used


def _rows(
    run_id: str, events: Sequence[tuple[int, Event]], docs: dict[str, bytes]
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[int, Any]]]:
    cp_rows: list[tuple[Any, ...]] = []
    w_rows: list[tuple[Any, ...]] = []
    hides: list[tuple[int, Any]] = []
    for position, body in events:
        if isinstance(body, CheckpointRecorded):
            data = docs.get(body.document.digest)
            if data is None:
                continue  # purged: nothing left to show
            doc = decode_document(data)
            digests = " ".join([body.document.digest, *sorted({d for _, d in doc.channels.values()})])
            cp_rows.append(
                (
                    run_id,
                    body.checkpoint_ns,
                    body.checkpoint_id,
                    body.parent_checkpoint_id,
                    position,
                    body.run_tag,
                    doc.metadata_json.decode(),
                    b"",  # the document is the blob named first in ``digests`` (``_DOCUMENT``)
                    digests,
                )
            )
        elif isinstance(body, WritesRecorded):
            for write in body.writes:
                w_rows.append(
                    (
                        run_id,
                        body.checkpoint_ns,
                        body.checkpoint_id,
                        body.task_id,
                        write.idx,
                        write.channel,
                        write.kind,
                        write.ref.digest,
                        body.task_path,
                        position,
                    )
                )
        elif isinstance(body, ThreadDeleted | ThreadPurged | CheckpointsHidden | ThreadPruned):
            hides.append((position, body))
    return _last_per_key(cp_rows, 3), _unique_writes(w_rows), hides


def _last_per_key(rows: list[tuple[Any, ...]], width: int) -> list[tuple[Any, ...]]:
    """One row per key (the first ``width`` columns), the latest winning, as upserts in log order.

    One statement cannot upsert a key twice ("ON CONFLICT DO UPDATE command cannot affect row a
    second time"), and a fold can hold several events for one key.
    """
    return list({row[:width]: row for row in rows}.values())


def _unique_writes(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Pending writes per key: the first regular write stays (insert if absent), a special one's
    (negative ``idx``: errors, interrupts) latest wins, as LangGraph's own savers keep them."""
    kept: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for row in rows:
        key = row[:5]
        if key not in kept or row[4] < 0:
            kept[key] = row
    return list(kept.values())
