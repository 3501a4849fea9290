"""Resume benchmark: what a resume costs through Baton against raw driver code reading the same rows.

    python bench/resume.py [--quick] [--backend postgres|sqlite|all] [--json FILE]

Runs of 1k, 10k and 100k events (``--quick``: 1k and 10k, about a minute); Markdown out, reported
in docs/benchmarks.md ("## Resume"). Goals are issue 3's, for PostgreSQL (SQLite for reference).
Per backend (PostgreSQL from ``tests.support.local_servers.LocalPostgres``, torn down at the end;
SQLite on a temp file) one store is made with ``init_store`` and filled through
``RunLedger.submit_many`` (batches of 1000: ``RecordIntent`` + ``RecordObservation`` pairs after
``OpenRun`` and ``AcquireLease``). Then, per run length:

1. **resume without snapshots** on a fresh ``open_ledger`` (pool opened before the clock starts):
   ``resume_fold(run, snapshots=False)`` + ``fold.snapshot()`` + ``summary_of(fold)``, p50 over
   rounds alternating with **raw**: a binary server-side psycopg cursor (sqlite3 on SQLite) over
   the run's rows, the ledger's ``msgspec`` decoder, ``domain.state.apply`` into a ``RunState``.
   Goal: <= 2x raw;
2. **resume from a snapshot**: a first resume writes one at the head; p50 from it, then again after
   ``SNAPSHOT_EVERY - 2`` events appended behind it (too few for a new one). Goal: <= 10 ms;
3. **memory**: one resume without snapshots in a fresh interpreter; peak RSS (VmHWM, reset first)
   growth over the RSS before it. Goal: <= 32 MiB.

Last, **view catch-up**: a fresh ``bootstrap.open_views(url).catch_up()`` over the whole store
against a raw fetch + decode + fold (a ``RunState`` per run) of the same rows in notification
order. Goal: >= 0.4x the raw rate. A benchmark, not a test: it checks only that appends are
accepted and that resumes reach the head.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
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

TTL_MS = 24 * 3600 * 1000  # the longest lease decide() allows: no lease expires during a run
BATCH = 1000  # submissions per submit_many (500 intent + observation pairs)
TAIL = SNAPSHOT_EVERY - 2  # events behind the latest snapshot, fewer than make a new one
ITERSIZE = 1000
GOAL_RATIO, GOAL_SNAPSHOT_MS, GOAL_MEMORY_MIB, GOAL_VIEWS = 2.0, 10.0, 32.0, 0.4  # issue 3's goals
DECODER = msgspec.json.Decoder(RecordedEvent, strict=False)  # the ledger's own decode of the stored form


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Store:
    backend: str  # "postgres" | "sqlite"
    url: str
    table: str


@contextlib.contextmanager
def open_store(backend: str) -> Iterator[Store]:
    with contextlib.ExitStack() as stack:
        if backend == "sqlite":
            url = f"sqlite:///{stack.enter_context(tempfile.TemporaryDirectory(prefix='baton-resume-'))}/ledger.db"
        else:
            from tests.support.local_servers import LocalPostgres

            url = stack.enter_context(LocalPostgres()).create_database("baton_resume")
        bootstrap.init_store(url)
        with contextlib.closing(bootstrap.open_ledger(url)) as ledger:
            table: str = ledger.recorder.events_table_name  # type: ignore[attr-defined]
        yield Store(backend, url, table)


def accept(verdicts: Sequence[Any]) -> None:
    bad = [v for v in verdicts if v.verdict != "accepted"]
    if bad:
        raise RuntimeError(f"benchmark append not accepted: {bad[0]}")


class RunBuilder:
    """One run, its worker holding the lease, filled with intent + observation pairs."""

    def __init__(self, ledger: RunLedger, run_id: str) -> None:
        self.ledger, self.run_id, self.worker = ledger, run_id, "worker-" + run_id[-6:]
        self.pairs = 0
        blob = BlobRef("sha256:" + "ab" * 32, 1024, "blob://bench/task")
        opened = OpenRun("rel-1", "bench", 1, blob)
        accept([ledger.submit(Submission(f"{run_id}/open", run_id, self.worker, opened))])
        grant = AcquireLease(Placement(self.worker, model="m", region="local"), ttl_ms=TTL_MS)
        accept([ledger.submit(Submission(f"{run_id}/lease", run_id, self.worker, grant))])
        self.events = 2

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
        while events > 0:
            batch: list[Submission] = []
            while len(batch) < min(BATCH, events):
                batch += self._pair()
            accept(self.ledger.submit_many(batch))
            events -= len(batch)
            self.events += len(batch)


def baton_resume(ledger: RunLedger, run_id: str, *, snapshots: bool) -> PortableStateFold:
    fold = ledger.resume_fold(run_id, snapshots=snapshots)
    fold.snapshot()
    summary_of(fold)
    return fold


def warm_ledger(url: str) -> RunLedger:
    """A fresh ledger with its connection pool open (PostgreSQL opens all of it on first use)."""
    ledger = bootstrap.open_ledger(url)
    with ledger.recorder.datastore.transaction(commit=False):  # type: ignore[attr-defined]
        pass
    return ledger


def timed(resume: Callable[[], int], head: int) -> float:
    """Seconds for one resume, which returns the version it reached: the run's head."""
    gc.collect()
    start = time.perf_counter()
    version = resume()
    seconds = time.perf_counter() - start
    if version != head:
        raise RuntimeError(f"a resume reached version {version}, expected {head}")
    return seconds


def time_baton(store: Store, run_id: str, head: int, *, snapshots: bool) -> float:
    """One resume on a fresh ledger whose connection pool is already open."""
    with contextlib.closing(warm_ledger(store.url)) as ledger:
        return timed(lambda: baton_resume(ledger, run_id, snapshots=snapshots).run.version, head)


class Raw:
    """The raw reader: one connection, opened before the clock starts."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.pg = psycopg.connect(store.url) if store.backend == "postgres" else None
        self.lite = sqlite3.connect(store.url.removeprefix("sqlite:///")) if store.backend == "sqlite" else None

    def states(self, sql: str, params: Sequence[Any]) -> Iterator[bytes]:
        """Stored envelopes streamed: a binary server-side cursor (PostgreSQL) or sqlite3's cursor."""
        if self.pg is not None:
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
        sql = f"SELECT state FROM {self.store.table} WHERE originator_id = %s ORDER BY originator_version"
        state = RunState(run_id=run_id)
        for data in self.states(sql, (run_id,)):
            apply(state, DECODER.decode(data))
        return state

    def fold_log(self, upto: int) -> dict[str, RunState]:
        """Every event up to notification id ``upto``, in notification order, folded per run."""
        column = "notification_id" if self.pg is not None else "rowid"
        sql = f"SELECT state FROM {self.store.table} WHERE {column} <= %s ORDER BY {column}"
        runs: dict[str, RunState] = {}
        for data in self.states(sql, (upto,)):
            event = DECODER.decode(data)
            state = runs.get(event.run_id)
            if state is None:  # a RunState only per new run, not per event
                state = runs[event.run_id] = RunState(run_id=event.run_id)
            apply(state, event)
        return runs

    def close(self) -> None:
        (self.pg or self.lite).close()  # type: ignore[union-attr]


def _rss(field_name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field_name} in /proc/self/status")


def probe_main(url: str, run_id: str) -> float | None:
    """In the subprocess: peak RSS growth (bytes) of one resume without snapshots; None without VmHWM reset."""
    with contextlib.closing(warm_ledger(url)) as ledger:
        gc.collect()
        before = _rss("VmRSS")
        try:  # reset VmHWM (Linux >= 4.0); ru_maxrss keeps the parent's peak across exec
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            return None
        baton_resume(ledger, run_id, snapshots=False)
        return _rss("VmHWM") - before


def probe(store: Store, run_id: str) -> float | None:
    cmd = [sys.executable, __file__, "--probe", json.dumps([store.url, run_id])]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"memory probe failed ({run_id}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@dataclass
class Row:
    backend: str
    events: int
    measure: str
    unit: str  # "ms" | "MiB" | "ev/s"
    value: float | None
    raw: float | None
    goal: str
    met: bool | None
    samples: dict[str, list[float]]  # seconds

    @property
    def ratio(self) -> float | None:
        return self.value / self.raw if self.value is not None and self.raw else None


def p50_ms(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1e3


def snapshot_row(store: Store, run_id: str, head: int, reps: int, measure: str) -> Row:
    seconds = [time_baton(store, run_id, head, snapshots=True) for _ in range(reps)]
    ms, goal = p50_ms(seconds), f"<= {GOAL_SNAPSHOT_MS:.0f} ms"
    return Row(store.backend, head, measure, "ms", ms, None, goal, ms <= GOAL_SNAPSHOT_MS, {"baton": seconds})


def measure_length(store: Store, raw: Raw, builder: RunBuilder) -> list[Row]:
    n, run_id, backend = builder.events, builder.run_id, store.backend
    reps = 9 if n <= 1_000 else 5 if n <= 10_000 else 3
    log(f"{backend} {n:,}: resume without snapshots vs raw ({reps} alternating rounds)")
    baton: list[float] = []
    raws: list[float] = []
    steps: list[Callable[[], None]] = [
        lambda: baton.append(time_baton(store, run_id, n, snapshots=False)),
        lambda: raws.append(timed(lambda: raw.resume(run_id).version, n)),
    ]
    for rnd in range(reps):
        for step in steps if rnd % 2 == 0 else steps[::-1]:
            step()
    b, r = p50_ms(baton), p50_ms(raws)
    samples, met = {"baton": baton, "raw": raws}, b / r <= GOAL_RATIO
    cold = Row(backend, n, "resume, no snapshots", "ms", b, r, "<= 2x raw", met, samples)

    log(f"{backend} {n:,}: memory of one resume (fresh interpreter)")
    growth = probe(store, run_id)
    mib = None if growth is None else growth / 2**20
    goal, met = f"<= {GOAL_MEMORY_MIB:.0f} MiB", None if mib is None else mib <= GOAL_MEMORY_MIB
    memory = Row(backend, n, "peak RSS growth, no snapshots", "MiB", mib, None, goal, met, {})

    log(f"{backend} {n:,}: priming the snapshot, then resumes from it")
    time_baton(store, run_id, n, snapshots=True)  # folds everything and writes a snapshot at the head
    with contextlib.closing(bootstrap.open_ledger(store.url)) as ledger:
        latest = ledger.snapshot_recorder.select_events(run_id, desc=True, limit=1)
    if not latest or latest[0].originator_version != n:
        raise RuntimeError(f"no snapshot at the head of {run_id} after a resume with snapshots")
    head = snapshot_row(store, run_id, n, reps, "from the head snapshot")
    builder.append(TAIL)
    log(f"{backend} {n:,}: {TAIL} events behind the snapshot")
    tail = snapshot_row(store, run_id, builder.events, reps, f"from a snapshot + {TAIL} events")
    return [cold, head, tail, memory]


def measure_views(store: Store, raw: Raw) -> Row:
    log(f"{store.backend}: view catch-up over the whole store")
    with contextlib.closing(bootstrap.open_views(store.url)) as runner:
        done = runner.catch_up()
    log(f"{store.backend}: raw fold of the same {done.events:,} events")
    raws: list[float] = []
    for _ in range(3):
        gc.collect()
        start = time.perf_counter()
        runs = raw.fold_log(done.position)
        raws.append(time.perf_counter() - start)
        if sum(state.version for state in runs.values()) < done.events:
            raise RuntimeError("the raw log fold saw fewer events than the views folded")
    rate, raw_rate, goal = done.rate, done.events / statistics.median(raws), f">= {GOAL_VIEWS}x raw"
    met, samples = rate / raw_rate >= GOAL_VIEWS, {"views": [done.seconds], "raw": raws}
    return Row(store.backend, done.events, "view catch-up", "ev/s", rate, raw_rate, goal, met, samples)


def bench_backend(backend: str, lengths: Sequence[int], rows: list[Row], builds: list[str]) -> None:
    with open_store(backend) as store:
        builders: list[RunBuilder] = []
        with contextlib.closing(bootstrap.open_ledger(store.url)) as ledger, contextlib.closing(Raw(store)) as raw:
            for n in lengths:
                start = time.perf_counter()
                builder = RunBuilder(ledger, f"run{n // 1000}k-{uuid.uuid4().hex[:8]}")
                builder.append(n - builder.events)
                seconds = time.perf_counter() - start
                builds.append(f"{backend}: {n:,} events in {seconds:.1f} s ({n / seconds:,.0f} events/s)")
                log(builds[-1])
                builders.append(builder)
            for builder in builders:
                rows += measure_length(store, raw, builder)
            rows.append(measure_views(store, raw))


def _num(value: float | None, unit: str) -> str:
    if value is None:
        return ""
    return f"{value:,.0f} {unit}" if unit == "ev/s" else f"{value:,.1f} {unit}"


def table(rows: list[Row]) -> str:
    lines = [
        "| backend | events | measure | Baton | raw | Baton / raw | goal | status |",
        "|---|---:|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        ratio = "" if r.ratio is None else f"{r.ratio:.2f}x" if r.unit == "ms" else f"{r.ratio:.3f}x"
        status = "unknown" if r.met is None else "met" if r.met else "**not met**"
        lines.append(
            f"| {r.backend} | {r.events:,} | {r.measure} | {_num(r.value, r.unit)} | {_num(r.raw, r.unit)} "
            f"| {ratio} | {r.goal} | {status} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="runs of 1k and 10k events only")
    parser.add_argument("--backend", choices=["postgres", "sqlite", "all"], default="all")
    parser.add_argument("--json", type=Path, help="also write the raw numbers here")
    parser.add_argument("--probe", help=argparse.SUPPRESS)  # internal: the memory probe (subprocess)
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(probe_main(*json.loads(args.probe))))
        return 0

    lengths = (1_000, 10_000) if args.quick else (1_000, 10_000, 100_000)
    backends = ["postgres", "sqlite"] if args.backend == "all" else [args.backend]
    info = machine_info()
    info["mode"] = "quick" if args.quick else "full"
    started = time.perf_counter()
    rows: list[Row] = []
    builds: list[str] = []
    for backend in backends:
        bench_backend(backend, lengths, rows, builds)
    info["elapsed"] = f"{time.perf_counter() - started:.0f} s"

    print("Machine: " + "; ".join(f"{key}: {value}" for key, value in info.items()))
    print("\nBuilding the runs (submit_many, 1000 submissions per batch):\n")
    print("\n".join(f"- {line}" for line in builds))
    print("\n## Resume (goals are issue 3's, for PostgreSQL)\n")
    print(table(rows))
    if args.json:
        payload = {"machine": info, "builds": builds, "rows": [asdict(r) | {"ratio": r.ratio} for r in rows]}
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
