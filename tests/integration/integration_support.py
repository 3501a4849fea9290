"""Builders and raw-database access shared by the integration tests.

A plain module (not a conftest) so that processes started with the ``spawn`` context can import
the worker functions below by name: pytest puts this directory on ``sys.path`` and ``spawn``
hands the parent's ``sys.path`` to its children.
"""

from __future__ import annotations

import contextlib
import queue
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import msgspec
import psycopg

from baton.adapters.bootstrap import open_ledger
from baton.adapters.clock import ManualClock
from baton.adapters.eventstore import RunLedger
from baton.domain.budgets import Ceilings
from baton.domain.commands import (
    AcquireLease,
    Command,
    ExpireLease,
    OpenRun,
    RecordIntent,
    RecordObservation,
    RenewLease,
    ReserveStage,
    ResumeFrom,
    Submission,
    Verdict,
)
from baton.domain.decide import context_digest
from baton.domain.events import BlobRef, IntentContext, Placement

__all__ = [
    "T0",
    "LedgerFactory",
    "TASK",
    "RawStore",
    "Submitter",
    "intent",
    "new_owner",
    "old_owner",
    "open_run",
    "positions",
    "reports_of",
]

T0 = 1_767_225_600_000_000  # ManualClock's default start, in microseconds
TASK = BlobRef("sha256:" + "ab" * 32, 11, "blob://task")

Backend = Literal["sqlite", "postgres"]
LedgerFactory = Callable[..., RunLedger]


@dataclass(frozen=True)
class RawStore:
    """Direct SQL on a store, behind the ledger's back: for checks and deliberate tampering."""

    url: str
    backend: Backend

    @property
    def events_table(self) -> str:
        return "stored_events" if self.backend == "sqlite" else "batonledger_events"

    @contextlib.contextmanager
    def connect(self) -> Iterator[Any]:
        """One connection that commits on success and rolls back on error."""
        if self.backend == "sqlite":
            conn = sqlite3.connect(unquote(urlsplit(self.url).path)[1:])
            try:
                with conn:
                    yield conn
            finally:
                conn.close()
        else:
            with psycopg.connect(self.url) as conn:
                yield conn

    def query(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of one statement written with ``?`` placeholders (translated for Postgres)."""
        with self.connect() as conn:
            return [tuple(row) for row in conn.execute(self._dialect(statement), tuple(params)).fetchall()]

    def execute(self, *statements: str | tuple[str, Sequence[Any]]) -> None:
        """Run statements in one transaction; a statement is SQL or ``(SQL, params)``."""
        with self.connect() as conn:
            for item in statements:
                statement, params = (item, ()) if isinstance(item, str) else item
                conn.execute(self._dialect(statement), tuple(params))

    def submission_ids(self) -> set[str]:
        return {row[0] for row in self.query("SELECT submission_id FROM baton_submissions")}

    def event_count(self, run_id: str) -> int:
        return self.query(f"SELECT COUNT(*) FROM {self.events_table} WHERE originator_id = ?", (run_id,))[0][0]

    def state_bytes(self, run_id: str, position: int) -> bytes:
        statement = f"SELECT state FROM {self.events_table} WHERE originator_id = ? AND originator_version = ?"
        return bytes(self.query(statement, (run_id, position))[0][0])

    def _dialect(self, statement: str) -> str:
        return statement if self.backend == "sqlite" else statement.replace("?", "%s")


@dataclass
class Submitter:
    """Sends one worker's commands to a ledger with fresh submission ids."""

    ledger: RunLedger
    run_id: str
    worker: str
    epoch: int = 0
    prefix: str = ""
    _ids: Iterator[int] = field(default_factory=count)

    def submission(self, command: Command, *, epoch: int | None = None, sid: str | None = None) -> Submission:
        sid = sid or f"{self.prefix or self.worker}-{next(self._ids)}"
        return Submission(sid, self.run_id, self.worker, command, self.epoch if epoch is None else epoch)

    def submit(self, command: Command, *, epoch: int | None = None, sid: str | None = None) -> Verdict:
        return self.ledger.submit(self.submission(command, epoch=epoch, sid=sid))

    def acquire(self, *, ttl_ms: int = 30_000) -> Verdict:
        verdict = self.submit(AcquireLease(Placement(self.worker), ttl_ms=ttl_ms))
        if verdict.verdict == "accepted":
            self.epoch = self.ledger.state(self.run_id).epoch
        return verdict


def open_run(ledger: RunLedger, run_id: str, *, ceilings: Ceilings | None = None) -> Verdict:
    command = OpenRun("release-1", "agent-state", 1, TASK, ceilings or Ceilings())
    return ledger.submit(Submission(f"open-{run_id}", run_id, "supervisor", command))


def intent(op_id: str, *, kind: Literal["effect", "pure"] = "pure", **arguments: Any) -> RecordIntent:
    context = IntentContext(turn=1, operation=op_id, arguments=arguments)
    return RecordIntent(op_id, kind, "tool@1", context, f"idem-{op_id}")


def observation(op_id: str, **arguments: Any) -> RecordObservation:
    """The ``ok`` outcome of ``intent(op_id, **arguments)``: a run takes one intent at a time, so each
    is settled before the next."""
    context = IntentContext(turn=1, operation=op_id, arguments=arguments)
    return RecordObservation(op_id, context_digest(context), "ok")


def settled_step(op_id: str, **arguments: Any) -> list[RecordIntent | RecordObservation]:
    """An intent and its observation, in submission order."""
    return [intent(op_id, **arguments), observation(op_id, **arguments)]


def positions(ledger: RunLedger, run_id: str) -> list[int]:
    return [event.position for event in ledger.history(run_id)]


def reports_of(processes: Sequence[Any], results: Any, timeout: float) -> list[Any]:
    """Start ``processes``, take one report from each off ``results``, and never leave one running.

    The reports are read before the joins: a child blocks on exit until what it put on the queue is read.
    """
    for process in processes:
        process.start()
    reports: list[Any] = []
    try:
        for _ in processes:
            reports.append(results.get(timeout=timeout))
    except queue.Empty:
        raise AssertionError(f"{len(processes) - len(reports)} of {len(processes)} processes never reported") from None
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
    return reports


# -- split brain: the two processes ------------------------------------------------------------

OLD_OWNER_MAX_SUBMISSIONS = 2_000
REJECTIONS_TO_COLLECT = 25
NEW_OWNER_APPENDS = 150
TAKEOVER_ATTEMPTS = 200
OLD_OWNER_STALL_S = 0.02


def old_owner(url: str, run_id: str, running: Any, striking: Any, results: Any, deadline_s: float) -> None:
    """Worker A at epoch 1 on a clock that never moves: appends until it has been rejected enough."""
    verdicts: list[dict[str, Any]] = []
    error = None
    ledger = open_ledger(url, clock=ManualClock(T0))
    end = time.monotonic() + deadline_s
    try:
        rejected = 0
        for i in range(OLD_OWNER_MAX_SUBMISSIONS):
            command: Command = RenewLease(ttl_ms=600_000) if i % 10 == 9 else ReserveStage(f"a-{i}", 1)
            verdict = ledger.submit(Submission(f"a-{i}", run_id, "A", command, 1))
            verdicts.append(msgspec.to_builtins(verdict))
            rejected += verdict.verdict == "rejected"
            if striking.is_set():
                # The classic split brain: the owner stalls (GC, swap), its lease lapses, it wakes
                # up and carries on. Without stalls a looping A starves the takeover, whose
                # compare-and-set on the run's head loses to each of A's appends.
                time.sleep(OLD_OWNER_STALL_S)
            if i == 10:
                running.set()  # the old owner is mid-loop: the new owner may strike now
            if rejected >= REJECTIONS_TO_COLLECT or time.monotonic() > end:
                break
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        running.set()
        ledger.close()
        results.put(("A", verdicts, error))


def _replayed(ledger: RunLedger, run_id: str) -> ResumeFrom:
    """What a new holder says once it has replayed the prefix the ledger froze at the takeover."""
    state = ledger.state(run_id)
    return ResumeFrom(state.prefix_position, state.prefix_digest)


def new_owner(url: str, run_id: str, running: Any, striking: Any, results: Any, deadline_s: float) -> None:
    """Worker B on a clock an hour ahead: expires A's lease, takes epoch 2 and appends with it."""
    verdicts: list[dict[str, Any]] = []
    error = None
    ledger = open_ledger(url, clock=ManualClock(T0 + 3_600_000_000))
    end = time.monotonic() + deadline_s
    try:
        running.wait(deadline_s)
        striking.set()
        for command in (ExpireLease(), AcquireLease(Placement("B"), ttl_ms=600_000)):
            for attempt in range(TAKEOVER_ATTEMPTS):
                sid = f"b-{type(command).__name__}-{attempt}"
                verdict = ledger.submit(Submission(sid, run_id, "B", command, 0))
                verdicts.append(msgspec.to_builtins(verdict))
                if verdict.verdict == "accepted" or time.monotonic() > end:
                    break
        striking.clear()  # A wakes up and goes back to its tight loop, now as a stale writer
        for i in range(NEW_OWNER_APPENDS):
            if time.monotonic() > end:
                break
            command = _replayed(ledger, run_id) if i == 0 else ReserveStage(f"b-{i}", 1)
            verdict = ledger.submit(Submission(f"b-{i}", run_id, "B", command, 2))
            verdicts.append(msgspec.to_builtins(verdict))
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        striking.clear()
        ledger.close()
        results.put(("B", verdicts, error))
