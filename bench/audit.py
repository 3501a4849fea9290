"""Audit benchmark: ``baton audit --all`` on PostgreSQL against a raw read of the same rows, same run.

    python bench/audit.py [--events N] [--runs R] [--quick] [--jobs J] [--rounds K] [--json FILE]

Default: 1,000,000 events across 1,000 runs; ``--quick``: 100,000 across 100. The script starts
its own PostgreSQL (``adapters.local_servers.LocalPostgres``, embedded, fsync on) and removes it
at the end.

**Populating.** Each run is built as Baton builds it, without ``decide``: ``RunOpened``,
``LeaseGranted`` (epoch 1), then ``IntentRecorded``/``ObservationRecorded`` pairs with their
charges and context digests, sealed into one chain by ``domain.chain.seal_stored`` and stored in
its stored form exactly as the ledger's mapper stores them (topic ``domain.events:<Type>``),
written with ``COPY`` into the events table; the run rows (``baton_runs``: head, head digest,
epoch, holder) as the fence would leave them. The stores'
submission rows are not written: the audit never reads them.

**Measured, alternating** (raw, audit, raw xJ, audit xJ, ...; ``--rounds`` of each):

* *raw*: the audit's own read of the same rows (``adapters.eventstore.audit_reader.stored_rows``:
  ``SELECT originator_id, state ... ORDER BY originator_id, originator_version``, binary results
  streamed in chunks of 5000 rows, or a server-side cursor before libpq 17) and a typed
  ``msgspec.json.Decoder(RecordedEvent, strict=False)`` decode of every row (the ledger's own decode:
  the stored form writes integers as decimal strings): the fastest sensible read that still decodes
  what it reads;
* *audit*: ``adapters.audit_runner.audit_store`` on a fresh ledger (what ``baton audit --all --jobs 1``
  runs: the same scan, ``AuditFold.apply_stored`` per event, the run-row anchors), asserting no problem;
* with ``--jobs J > 1`` (default: ``baton audit``'s, one more than the CPUs, at most 4): *raw xJ*
  and *audit xJ*, the same two split into J key ranges
  of about equal event counts (``key_ranges``), one forked process and connection each (what
  ``baton audit --all --jobs J`` runs).

Reported: events/s, the ratio to the raw read of the same process count, the client's CPU time per
event (this process and its finished workers: what the audit costs whatever else runs on the
machine; the PostgreSQL server's share is not in it), the load average. On a shared machine the CPU
per event is the steadier number: wall-clock rates move with the load.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/audit.py` puts bench/ first, not the project root
    sys.path.insert(0, str(ROOT))

import msgspec
import psycopg

from baton.adapters.audit_runner import DEFAULT_JOBS, audit_store
from baton.adapters.bootstrap import init_store, open_ledger
from baton.adapters.eventstore.audit_reader import KeyRange, key_ranges, stored_rows
from baton.adapters.eventstore.mapper import TOPIC_PREFIX
from baton.domain.budgets import Usage
from baton.domain.canonical import ZERO_DIGEST, canonical_bytes
from baton.domain.chain import seal_stored
from baton.domain.commands import ReleaseLease, Submission
from baton.domain.decide import context_digest
from baton.domain.events import (
    BlobRef,
    Event,
    IntentContext,
    IntentRecorded,
    LeaseGranted,
    ObservationRecorded,
    Placement,
    RecordedEvent,
    RunOpened,
)
from bench.machine import machine_info

GOAL_EVENTS_PER_S = 100_000
T0 = 1_767_225_600_000_000
_decoder = msgspec.json.Decoder(RecordedEvent, strict=False)  # the ledger's own decode of its stored form


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_events(run_id: str, length: int) -> list[tuple[RecordedEvent, bytes]]:
    """One run of ``length`` events and their stored forms, chained as the ledger would seal them."""
    placement = Placement("worker-1", model="m", provider="p", region="r", tool_contracts=("shell@1",))
    bodies: list[Event] = [
        RunOpened("release-1", "agent-state", 1, BlobRef("sha256:" + "ab" * 32, 11, "blob://task")),
        LeaseGranted("worker-1", 1, placement, T0 + 86_400_000_000),
    ]
    for i in range((length - 2 + 1) // 2):
        context = IntentContext(i, "shell", arguments={"cmd": "pytest -q", "i": i})
        size = len(canonical_bytes(context.arguments, opaque=True)) - 1
        digest = context_digest(context)
        bodies.append(IntentRecorded(f"op-{i}", "pure", "shell@1", context, digest, f"k-{i}", Usage(1, size)))
        bodies.append(ObservationRecorded(f"op-{i}", digest, "ok", Usage(result_bytes=12), result={"exit": 0}))
    bodies = bodies[:length]
    opened = seal_stored(
        run_id, 0, ZERO_DIGEST, Submission(f"{run_id}-0", run_id, "sup", ReleaseLease()), 0, bodies[:1], T0
    )
    resumed = Submission(f"{run_id}-1", run_id, "worker-1", ReleaseLease(), 1)
    rest = seal_stored(run_id, 1, opened[0][0].digest, resumed, 1, bodies[1:], T0)
    return opened + rest


def populate(url: str, events: int, runs: int) -> None:
    """Fill the store: COPY the events, then insert the run rows as the fence leaves them."""
    per_run = events // runs
    notification = 0
    with psycopg.connect(url) as conn:
        heads: list[tuple[Any, ...]] = []
        with (
            conn.cursor() as cur,
            cur.copy(
                "COPY batonledger_events (originator_id, originator_version, topic, state, notification_id) FROM STDIN"
            ) as copy,
        ):
            for r in range(runs):
                run_id = f"run-{r:05d}"
                log_ = run_events(run_id, per_run + (1 if r < events % runs else 0))
                for event, stored in log_:
                    notification += 1
                    copy.write_row((run_id, event.position, TOPIC_PREFIX + event.type, stored, notification))
                last = log_[-1][0]
                heads.append(
                    (run_id, last.position, last.digest, 1, "worker-1", T0 + 86_400_000_000, "GENERATING", "open")
                )
                if r % max(1, runs // 10) == 0:
                    log(f"  populated {r + 1}/{runs} runs")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO baton_runs VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", heads)
        conn.execute("ANALYZE batonledger_events")


def _raw_range(args: tuple[str, KeyRange]) -> int:
    """The audit's own read of a key range (``stored_rows``), typed decode per row."""
    url, key_range = args
    ledger = open_ledger(url, one_shot=True)
    count = 0
    try:
        for _, state in stored_rows(ledger, key_range=key_range):
            _decoder.decode(state)
            count += 1
    finally:
        ledger.close()
    return count


def _ranges(url: str, jobs: int) -> list[KeyRange]:
    ledger = open_ledger(url, one_shot=True)
    try:
        return key_ranges(ledger.runs(), jobs)
    finally:
        ledger.close()


def raw_read(url: str, jobs: int = 1) -> int:
    """The same rows, read the same way as the audit reads them, in ``jobs`` processes (forked)."""
    if jobs == 1:
        return _raw_range((url, (None, None)))
    context = multiprocessing.get_context("fork")
    with context.Pool(jobs) as pool:
        return sum(pool.map(_raw_range, [(url, r) for r in _ranges(url, jobs)]))


def audit_all(url: str, jobs: int = 1) -> int:
    """What ``baton audit --all --jobs J`` runs."""
    ledger = open_ledger(url, one_shot=True)
    try:
        report = audit_store(ledger, jobs=jobs, store=url)
    finally:
        ledger.close()
    assert report.ok, report.problems[:5]
    return report.events_checked


def timed(fn: Any, *args: Any) -> tuple[int, float, float]:
    cpu, wall = _cpu(), time.perf_counter()
    count = fn(*args)
    return count, time.perf_counter() - wall, _cpu() - cpu


def _cpu() -> float:
    """CPU seconds of this process and of its children that have ended (the forked workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def measure(url: str, rounds: int, jobs: int) -> Iterator[dict[str, Any]]:
    for round_ in range(rounds):
        for name, fn, args in (
            ("raw", raw_read, (url, 1)),
            ("audit", audit_all, (url, 1)),
            *(
                [(f"raw x{jobs}", raw_read, (url, jobs)), (f"audit x{jobs}", audit_all, (url, jobs))]
                if jobs > 1
                else []
            ),
        ):
            load = os.getloadavg()[0]
            count, wall, cpu = timed(fn, *args)
            log(f"  round {round_ + 1} {name}: {count:,} events in {wall:.1f} s ({count / wall:,.0f} ev/s)")
            yield {"round": round_ + 1, "name": name, "events": count, "seconds": wall, "cpu": cpu, "load": load}


def report(results: list[dict[str, Any]], info: dict[str, str], args: argparse.Namespace) -> str:
    def best(name: str) -> dict[str, Any]:
        return min((r for r in results if r["name"] == name), key=lambda r: r["seconds"])

    rows = []
    for name in dict.fromkeys(r["name"] for r in results):
        r = best(name)
        raw = best(name.replace("audit", "raw"))  # the raw read with as many processes
        rate = r["events"] / r["seconds"]
        ratio = rate / (raw["events"] / raw["seconds"])
        goal = "" if name.startswith("raw") else ("met" if rate >= GOAL_EVENTS_PER_S else "NOT met")
        rows.append(
            f"| {name} | {r['events']:,} | {r['seconds']:.1f} | {rate:,.0f} | {ratio:.2f}x "
            f"| {r['cpu'] / r['events'] * 1e6:.1f} | "
            f"{r['load']:.1f} | {goal} |"
        )
    head = (
        f"Audit benchmark, {args.events:,} events across {args.runs:,} runs (PostgreSQL), "
        f"best of {args.rounds} rounds\n\n"
        + "\n".join(f"* {k}: {v}" for k, v in info.items())
        + f"\n* loadavg at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n\n"
        "| measured | events | seconds | events/s | vs raw (same processes) | client CPU µs/event | load (1 min) "
        "| goal >=100k ev/s |\n"
        "|---|---:|---:|---:|---:|---:|---:|---|\n"
    )
    return head + "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=None)
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="100k events across 100 runs")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--jobs", type=int, default=DEFAULT_JOBS, help="also read and audit with this many processes (as baton audit)"
    )
    parser.add_argument("--json", help="write the raw results here")
    args = parser.parse_args()
    args.events = args.events or (100_000 if args.quick else 1_000_000)
    args.runs = args.runs or (100 if args.quick else 1_000)
    info = machine_info()
    from tests.support.local_servers import LocalPostgres

    with LocalPostgres() as pg:
        url = pg.create_database("baton_audit")
        init_store(url)
        log(f"populating {args.events:,} events across {args.runs:,} runs")
        started = time.perf_counter()
        populate(url, args.events, args.runs)
        log(f"populated in {time.perf_counter() - started:.0f} s")
        results = list(measure(url, args.rounds, args.jobs))
    print(report(results, info, args))
    if args.json:
        Path(args.json).write_text(json.dumps({"info": info, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
