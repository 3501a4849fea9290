"""Audit benchmark: ``baton audit --all`` on PostgreSQL against a raw read of the same rows, same run.

    python bench/audit.py [--events N] [--runs R] [--quick] [--jobs J] [--rounds K] [--json FILE]

Default: 1,000,000 events across 1,000 runs; ``--quick``: 100,000 across 100. The script starts
its own PostgreSQL (``adapters.local_servers.LocalPostgres``, embedded, fsync on) and removes it
at the end.

**Populating.** Each run is built as Baton builds it, without ``decide``: ``RunOpened``,
``LeaseGranted`` (epoch 1), then ``IntentRecorded``/``ObservationRecorded`` pairs with their
charges and context digests, sealed into one chain by ``domain.chain.seal`` and stored exactly as
the ledger's mapper stores them (``msgspec.json.encode`` of the envelope, topic
``domain.events:<Type>``), written with ``COPY`` into the events table; the run rows
(``baton_runs``: head, head digest, epoch, holder) as the fence would leave them. The stores'
submission rows are not written: the audit never reads them.

**Measured, alternating** (raw, audit, raw, audit ...; ``--rounds`` of each):

* *raw*: one psycopg server-side cursor (``itersize`` 2000) over ``SELECT originator_id, state FROM
  batonledger_events ORDER BY originator_id, originator_version`` (the audit's own query) and a typed
  ``msgspec.json.Decoder(RecordedEvent)`` decode of every row;
* *audit*: ``adapters.cli_audit.audit_store`` on a fresh ledger (what ``baton audit --all`` runs:
  the same scan, ``AuditFold.apply_stored`` per event, the run-row anchors), asserting no problem;
* with ``--jobs J > 1``, also *audit xJ*: the runs split into J processes, each auditing its runs
  one by one with ``audit_store(ledger, run_id)`` (not a CLI option yet), wall time of the slowest.

Reported: events/s, the ratio audit/raw, CPU seconds of the measuring process, the load average.
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

import msgspec  # noqa: E402
import psycopg  # noqa: E402

from adapters.bootstrap import init_store, open_ledger  # noqa: E402
from adapters.cli_audit import audit_store  # noqa: E402
from adapters.eventstore.mapper import TOPIC_PREFIX  # noqa: E402
from bench.machine import machine_info  # noqa: E402
from domain.budgets import Usage  # noqa: E402
from domain.canonical import ZERO_DIGEST, canonical_bytes  # noqa: E402
from domain.chain import seal  # noqa: E402
from domain.commands import ReleaseLease, Submission  # noqa: E402
from domain.decide import context_digest  # noqa: E402
from domain.events import (  # noqa: E402
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

GOAL_EVENTS_PER_S = 100_000
T0 = 1_767_225_600_000_000
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(RecordedEvent)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_events(run_id: str, length: int) -> list[RecordedEvent]:
    """One run of ``length`` events, chained as the ledger would seal them."""
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
    opened = seal(run_id, 0, ZERO_DIGEST, Submission(f"{run_id}-0", run_id, "sup", ReleaseLease()), 0, bodies[:1], T0)
    rest = seal(
        run_id, 1, opened[0].digest, Submission(f"{run_id}-1", run_id, "worker-1", ReleaseLease(), 1), 1, bodies[1:], T0
    )
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
                for event in log_:
                    notification += 1
                    copy.write_row(
                        (run_id, event.position, TOPIC_PREFIX + event.type, _encoder.encode(event), notification)
                    )
                last = log_[-1]
                heads.append(
                    (run_id, last.position, last.digest, 1, "worker-1", T0 + 86_400_000_000, "GENERATING", "open")
                )
                if r % max(1, runs // 10) == 0:
                    log(f"  populated {r + 1}/{runs} runs")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO baton_runs VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", heads)
        conn.execute("ANALYZE batonledger_events")


def raw_read(url: str) -> int:
    count = 0
    with psycopg.connect(url) as conn, conn.transaction(), conn.cursor(name="raw") as cur:
        cur.itersize = 2000
        cur.execute("SELECT originator_id, state FROM batonledger_events ORDER BY originator_id, originator_version")
        for _, state in cur:
            _decoder.decode(state)
            count += 1
    return count


def audit_all(url: str) -> int:
    ledger = open_ledger(url, one_shot=True)
    try:
        report = audit_store(ledger)
    finally:
        ledger.close()
    assert report.ok, report.problems[:5]
    return report.events_checked


def _audit_some(args: tuple[str, list[str]]) -> int:
    url, run_ids = args
    ledger = open_ledger(url, one_shot=True)
    events = 0
    try:
        for run_id in run_ids:
            report = audit_store(ledger, run_id)
            assert report.ok, report.problems[:5]
            events += report.events_checked
    finally:
        ledger.close()
    return events


def audit_parallel(url: str, jobs: int, pool: Any) -> int:
    with psycopg.connect(url) as conn:
        run_ids = [row[0] for row in conn.execute("SELECT run_id FROM baton_runs ORDER BY run_id")]
    shares = [(url, run_ids[i::jobs]) for i in range(jobs)]
    return sum(pool.map(_audit_some, shares))


def timed(fn: Any, *args: Any) -> tuple[int, float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    count = fn(*args)
    return count, time.perf_counter() - wall, time.process_time() - cpu


def measure(url: str, rounds: int, jobs: int) -> Iterator[dict[str, Any]]:
    pool = multiprocessing.get_context("spawn").Pool(jobs) if jobs > 1 else None
    try:
        for round_ in range(rounds):
            for name, fn, args in (
                ("raw", raw_read, (url,)),
                ("audit", audit_all, (url,)),
                *([(f"audit x{jobs}", audit_parallel, (url, jobs, pool))] if pool else []),
            ):
                load = os.getloadavg()[0]
                count, wall, cpu = timed(fn, *args)
                log(f"  round {round_ + 1} {name}: {count:,} events in {wall:.1f} s ({count / wall:,.0f} ev/s)")
                yield {"round": round_ + 1, "name": name, "events": count, "seconds": wall, "cpu": cpu, "load": load}
    finally:
        if pool is not None:
            pool.close()
            pool.join()


def report(results: list[dict[str, Any]], info: dict[str, str], args: argparse.Namespace) -> str:
    def best(name: str) -> dict[str, Any]:
        return min((r for r in results if r["name"] == name), key=lambda r: r["seconds"])

    raw = best("raw")
    rows = []
    for name in dict.fromkeys(r["name"] for r in results):
        r = best(name)
        rate = r["events"] / r["seconds"]
        ratio = rate / (raw["events"] / raw["seconds"])
        goal = "" if name == "raw" else ("met" if rate >= GOAL_EVENTS_PER_S else "NOT met")
        rows.append(
            f"| {name} | {r['events']:,} | {r['seconds']:.1f} | {rate:,.0f} | {ratio:.2f}x | {r['cpu']:.1f} | "
            f"{r['load']:.1f} | {goal} |"
        )
    head = (
        f"Audit benchmark, {args.events:,} events across {args.runs:,} runs (PostgreSQL), "
        f"best of {args.rounds} rounds\n\n"
        + "\n".join(f"* {k}: {v}" for k, v in info.items())
        + f"\n* loadavg at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n\n"
        "| measured | events | seconds | events/s | vs raw | CPU s (this process) | load (1 min) | goal >=100k ev/s |\n"
        "|---|---:|---:|---:|---:|---:|---:|---|\n"
    )
    return head + "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=None)
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="100k events across 100 runs")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=1, help="also audit with this many processes")
    parser.add_argument("--json", help="write the raw results here")
    args = parser.parse_args()
    args.events = args.events or (100_000 if args.quick else 1_000_000)
    args.runs = args.runs or (100 if args.quick else 1_000)
    info = machine_info()
    from adapters.local_servers import LocalPostgres

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
