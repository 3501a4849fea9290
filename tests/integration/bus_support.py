"""Helpers for the bus tests: submissions, clients, waiting on conditions, worker processes.

A plain module (not a conftest) so that worker processes started with ``spawn`` can import the
worker function by name (pytest puts this directory on ``sys.path``; ``spawn`` passes it on).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

import msgspec
import nats
from nats.aio.client import Client as NatsClient

from baton.adapters.wire import decode_verdict, encode_submission
from baton.domain.budgets import Ceilings
from baton.domain.commands import (
    AcquireLease,
    Command,
    ExpireLease,
    OpenRun,
    RecordIntent,
    ReserveStage,
    Submission,
    Verdict,
)
from baton.domain.events import BlobRef, IntentContext, Placement, RecordedEvent

__all__ = [
    "BackgroundLoop",
    "acquire",
    "eventually",
    "intent",
    "open_run",
    "request",
    "stream_events",
    "submission",
    "worker_process",
]

T = TypeVar("T")
TASK = BlobRef("sha256:" + "ab" * 32, 11, "blob://task")
TIMEOUT = 30.0  # generous: a loaded 2-core machine


def submission(sid: str, run_id: str, worker: str, command: Command, epoch: int = 0) -> Submission:
    return Submission(sid, run_id, worker, command, epoch)


def open_run(run_id: str) -> Submission:
    return submission(f"open-{run_id}", run_id, "supervisor", OpenRun("release-1", "agent-state", 1, TASK, Ceilings()))


def acquire(run_id: str, worker: str, *, sid: str | None = None, ttl_ms: int = 30_000) -> Submission:
    return submission(sid or f"acquire-{run_id}-{worker}", run_id, worker, AcquireLease(Placement(worker), ttl_ms))


def intent(
    run_id: str, worker: str, epoch: int, op_id: str, *, sid: str | None = None, arguments: dict[str, Any] | None = None
) -> Submission:
    context = IntentContext(turn=1, operation=op_id, arguments=arguments or {"n": op_id})
    command = RecordIntent(op_id, "pure", "tool@1", context, f"idem-{op_id}")
    return submission(sid or f"{run_id}-{worker}-{op_id}", run_id, worker, command, epoch)


def stage(run_id: str, worker: str, epoch: int, stage_id: str) -> Submission:
    """A stage reservation: work that opens nothing, so any number of them may follow one another
    (an intent must be settled before the next)."""
    return submission(f"{run_id}-{worker}-{stage_id}", run_id, worker, ReserveStage(stage_id, 1), epoch)


async def request(nc: NatsClient, item: Submission | bytes, run_id: str | None = None) -> Verdict:
    """Core request-reply: one submission, its verdict."""
    raw = encode_submission(item) if isinstance(item, Submission) else item
    run = run_id or (item.run_id if isinstance(item, Submission) else "any")
    reply = await nc.request(f"baton.runs.{run}.submit", raw, timeout=TIMEOUT)
    return decode_verdict(reply.data)


async def eventually(condition: Callable[[], Awaitable[bool]], *, timeout: float = TIMEOUT, what: str = "") -> None:
    """Wait on a condition instead of sleeping a guessed time."""
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        await asyncio.sleep(0.05)


async def stream_events(nc: NatsClient, run_id: str | None = None) -> list[tuple[dict[str, str], RecordedEvent]]:
    """Every message of the events stream (of one run), in stream order, with its headers."""
    js = nc.jetstream()
    info = await js.stream_info("BATON_EVENTS")
    found = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        if info.state.messages == 0:
            break
        msg = await js.get_msg("BATON_EVENTS", seq=seq)
        headers = dict(msg.headers or {})
        if run_id is None or headers.get("Baton-Run-Id") == run_id:
            found.append((headers, msgspec.json.decode(msg.data or b"", type=RecordedEvent)))
    return found


class BackgroundLoop:
    """An asyncio loop in a thread: hosts a bus for a whole module while tests talk to it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="bus-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()


# -- the scale-out worker process ---------------------------------------------------------------


def worker_process(nats_url: str, run_id: str, role: str, intents: int, results: Any) -> None:
    """One worker process of the scale-out test; puts (role, run, [(submission, verdict)], error)."""
    log: list[tuple[dict[str, Any], dict[str, Any]]] = []
    error = None
    try:
        asyncio.run(_worker(nats_url, run_id, role, intents, log))
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    results.put((role, run_id, log, error))


async def _worker(nats_url: str, run_id: str, role: str, intents: int, log: list[Any]) -> None:
    nc = await nats.connect(nats_url, connect_timeout=TIMEOUT)
    tag = uuid.uuid4().hex[:6]

    async def send(item: Submission) -> Verdict:
        verdict = await request(nc, item)
        log.append((msgspec.to_builtins(item), msgspec.to_builtins(verdict)))
        return verdict

    try:
        if role == "A":  # opens the run, holds epoch 1 briefly, keeps appending past its lease
            await send(open_run(run_id))
            await send(acquire(run_id, "A", ttl_ms=1_500))
            deadline = time.monotonic() + TIMEOUT * 2  # B may start late on a loaded machine
            for i in range(intents):
                verdict = await send(intent(run_id, "A", 1, f"a{i}-{tag}"))
                if verdict.reason == "stale_epoch" or time.monotonic() > deadline:
                    break  # the lease moved on: A has learnt it
                await asyncio.sleep(0.01)
        else:  # B: waits for the lease to expire, takes epoch 2, appends with it
            epoch, held = 0, False
            deadline = time.monotonic() + TIMEOUT
            while epoch == 0 and time.monotonic() < deadline:
                expired = await send(submission(f"expire-{tag}-{len(log)}", run_id, "B", ExpireLease()))
                held = held or expired.reason == "lease_held"  # A holds epoch 1: B may take over once it expires
                if expired.verdict == "accepted" or (held and expired.reason == "no_lease"):
                    taken = await send(acquire(run_id, "B", sid=f"acquire-B-{tag}-{len(log)}"))
                    if taken.verdict == "accepted":
                        epoch = 2
                        break
                await asyncio.sleep(0.1)
            if epoch == 0:
                raise RuntimeError("B never took the lease")
            for i in range(intents):
                await send(intent(run_id, "B", epoch, f"b{i}-{tag}"))
    finally:
        await nc.close()


# -- a service that dies between its commit and its ack ------------------------------------------


def doomed_service(store_url: str, nats_url: str, committed: Any) -> None:
    """Serves durable submissions but hangs before acknowledging: the test SIGKILLs it there."""
    from baton.adapters.bootstrap import open_ledger
    from baton.adapters.bus import NatsBus, NatsOptions

    async def hang_before_ack() -> None:
        committed.set()
        await asyncio.Event().wait()

    async def main() -> None:
        ledger = open_ledger(store_url)
        async with NatsBus(ledger, nats_url, NatsOptions(ack_wait=2.0, before_ack=hang_before_ack, relay=False)):
            await asyncio.Event().wait()

    asyncio.run(main())
