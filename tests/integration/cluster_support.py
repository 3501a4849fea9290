"""Workers for the cluster tests: real ``baton.Worker`` clients over NATS, each logging every verdict.

A plain module (not a conftest) so that worker processes started with ``spawn`` can import the
process function by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import nats
from nats.js.errors import NoKeysError

from baton.adapters.bootstrap import open_ledger
from baton.adapters.bus.partitions import BUCKET
from baton.adapters.worker import NatsTransport, Worker
from baton.domain import errors
from baton.domain.commands import Submission, Verdict
from baton.domain.events import IntentContext, Placement

__all__ = ["VerdictLog", "owners", "seconds_until", "worker_process"]

TOOL = "echo@1"


class VerdictLog:
    """A transport that writes down every answer it brings back: the worker's client-side log.

    One entry per try: ``(time, submission id, command, verdict, reason, position)``, with verdict
    ``"unavailable"`` for a try that got no verdict (the worker retries it with the same id).
    """

    def __init__(self, inner: NatsTransport) -> None:
        self.inner = inner
        self.entries: list[tuple[float, str, str, str, str | None, int | None]] = []

    def submit(self, submission: Submission) -> Verdict:
        return self.submit_many([submission])[0]

    def submit_many(self, submissions: Sequence[Submission]) -> list[Verdict]:
        try:
            verdicts = self.inner.submit_many(submissions)
        except errors.StoreUnavailable:
            now = time.time()
            self.entries += [
                (now, s.submission_id, type(s.command).__name__, "unavailable", None, None) for s in submissions
            ]
            raise
        now = time.time()
        for s, v in zip(submissions, verdicts, strict=True):
            self.entries.append((now, s.submission_id, type(s.command).__name__, v.verdict, v.reason, v.position))
        return verdicts

    def close(self) -> None:
        self.inner.close()


def worker_process(bus_url: str, store_url: str, run_ids: list[str], stop: Any, results: Any) -> None:
    """Drive one run per thread until ``stop`` is set; put ``(run_id, entries, steps, error)`` per run."""
    reports: list[Any] = []
    threads = [threading.Thread(target=_drive, args=(bus_url, store_url, run_id, stop, reports)) for run_id in run_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for report in reports:
        results.put(report)


def _drive(bus_url: str, store_url: str, run_id: str, stop: Any, reports: list[Any]) -> None:
    log: VerdictLog | None = None
    steps, error = 0, None
    try:
        with contextlib.closing(open_ledger(store_url)) as reader:
            log = VerdictLog(NatsTransport(bus_url, timeout=2.0))
            # retried with the same submission id for up to a minute: an outage is waited out, never re-sent
            worker = Worker(Placement(f"w-{run_id}", tool_contracts=(TOOL,)), log, reader, retries=60, liveness=False)
            try:
                worker.open_run(run_id, "rel-1", ("cluster-faults", 1), {"run": run_id})
                worker.acquire(run_id)
                while not stop.is_set():
                    steps += 1
                    context = IntentContext(1, "echo", effect="read", arguments={"step": steps})
                    worker.step(run_id, f"op-{steps}", TOOL, context, lambda n=steps: {"step": n})
                    time.sleep(0.05)
                worker.release(run_id)
            finally:
                worker.close()
                log.close()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    reports.append((run_id, log.entries if log is not None else [], steps, error))


def seconds_until(condition: Callable[[], bool], what: str, timeout: float = 60) -> float:
    """Seconds until ``condition()`` holds (polled every 0.1 s); a timeout fails the test, naming ``what``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)
    return round(time.monotonic() - started, 2)


def owners(urls: list[str]) -> dict[int, str]:
    """Who holds each run partition now, from the KV bucket the services lease them in."""

    async def read() -> dict[int, str]:
        nc = await nats.connect(urls, connect_timeout=10)
        try:
            kv = await nc.jetstream().key_value(BUCKET)
            try:
                keys = await kv.keys()
            except NoKeysError:
                return {}
            held = {}
            for key in keys:
                if key.startswith("p."):
                    with contextlib.suppress(Exception):  # deleted between the listing and the read
                        entry = await kv.get(key)
                        if entry.value:
                            held[int(key[2:])] = entry.value.decode()
            return held
        finally:
            await nc.close()

    return asyncio.run(read())
