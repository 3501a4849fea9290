"""The worker process of the lease soak (``test_soak.py``): a plain module, so ``spawn`` can import it.

Each worker competes for the leases of a few runs on the real clock, with leases of 50-200 ms, and
behaves as a flaky owner would: it appends intents and observations while it believes it holds a
lease, renews and releases it now and then, and stalls at random (a GC pause, a slow tool call), after
which it carries on with the epoch it had. Whatever the ledger answers is recorded, so the test can
hold the verdicts against the log.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import msgspec

from baton.adapters.bootstrap import open_ledger
from baton.domain.commands import (
    AcquireLease,
    Command,
    RecordIntent,
    RecordObservation,
    ReleaseLease,
    RenewLease,
    Submission,
    Verdict,
)
from baton.domain.decide import context_digest
from baton.domain.events import IntentContext, Placement

__all__ = ["soak_worker"]

_LOSES_THE_LEASE = {"stale_epoch", "lease_expired", "no_lease"}


class _FlakyOwner:
    """One worker's beliefs (the epoch it thinks it holds, its open operations) and its next move."""

    def __init__(self, worker: str, runs: list[str], seed: int) -> None:
        self.worker = worker
        self.rng = random.Random(seed)
        self.held: dict[str, int] = {}  # the epoch this worker believes it holds, per run
        self.open_ops: dict[str, list[tuple[str, str]]] = {run: [] for run in runs}  # (op id, context digest)

    def command(self, run: str, n: int) -> Command | None:
        """The next command for ``run`` (None: stall instead, as a paused process would)."""
        roll, ttl_ms = self.rng.random(), self.rng.choice((50, 100, 200))
        if roll < 0.05:
            return None
        if not self.held.get(run) or roll < 0.10:
            return AcquireLease(Placement(self.worker), ttl_ms=ttl_ms)
        if roll < 0.60 or not self.open_ops[run]:
            op_id = f"{self.worker}-op-{n}"
            context = IntentContext(turn=n, operation="tool", arguments={"n": n})
            return RecordIntent(op_id, "pure", "tool@1", context, f"idem-{op_id}")
        if roll < 0.85:
            op_id, digest = self.open_ops[run].pop(0)
            return RecordObservation(op_id, digest, "ok", result={"n": n})
        return RenewLease(ttl_ms=ttl_ms) if roll < 0.97 else ReleaseLease()

    def learn(self, run: str, command: Command, verdict: Verdict, holder_epoch: Callable[[], int]) -> None:
        """Update the beliefs from a verdict; ``holder_epoch`` reads the run's epoch if this worker holds it."""
        if verdict.verdict == "accepted":
            if isinstance(command, AcquireLease):
                self.held[run] = holder_epoch()
            elif isinstance(command, ReleaseLease):
                self.held[run] = 0
            elif isinstance(command, RecordIntent):
                self.open_ops[run].append((command.op_id, context_digest(command.context)))
        elif verdict.reason in _LOSES_THE_LEASE:
            self.held[run] = 0
            self.open_ops[run].clear()  # intended at an epoch that is over: they need reconciling, not observing


def soak_worker(url: str, runs: list[str], worker: str, seconds: float, seed: int, results: Any) -> None:
    """Submit for ``seconds``; put ``(worker, [(submission, verdict)], error)`` on ``results``."""
    owner = _FlakyOwner(worker, runs, seed)
    log: list[tuple[dict[str, Any], dict[str, Any]]] = []
    error = None
    ledger = open_ledger(url)  # the system clock: leases lapse in real time

    def holder_epoch(run: str) -> int:
        state = ledger.state(run)
        return state.epoch if state.holder == worker else 0

    deadline = time.monotonic() + seconds
    n = 0
    try:
        while time.monotonic() < deadline:
            n += 1
            run = owner.rng.choice(runs)
            command = owner.command(run, n)
            if command is None:
                time.sleep(owner.rng.uniform(0.05, 0.3))  # the lease may lapse; the worker will not notice
                continue
            submission = Submission(f"{worker}-{n}", run, worker, command, owner.held.get(run, 0))
            verdict = ledger.submit(submission)
            log.append((msgspec.to_builtins(submission), msgspec.to_builtins(verdict)))
            owner.learn(run, command, verdict, lambda run=run: holder_epoch(run))
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        ledger.close()
        results.put((worker, log, error))
