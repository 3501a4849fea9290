"""The worker client: the SDK an agent worker imports to record what it does, resume and hand off.

The same ``Worker`` API runs in-process against a store (``LedgerTransport``) or over NATS
(``NatsTransport``: request-reply on ``baton.runs.<run_id>.submit``, served by ``baton serve``).
Writes go through the transport; reads (resume, handoff documents) come from a store, which may
be a read replica. Every command gets a submission id from the worker's name and a counter, and a
transport failure is retried with the *same* id, so a lost reply never appends twice. A rejection
raises the domain's own error class for its reason code (``StaleEpoch`` with the current epoch,
``UncertainIntent``, ...), so callers handle one error tree whichever transport they use.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from baton.adapters import handoff, handoff_state
from baton.adapters.bus_urls import servers
from baton.adapters.eventstore import RunLedger
from baton.adapters.identity import SigningKey
from baton.adapters.loop_thread import LoopThread
from baton.adapters.wire import decode_verdict
from baton.domain import errors
from baton.domain.budgets import Ceilings, Usage
from baton.domain.checkpoint import PortableState
from baton.domain.commands import (
    AcceptHandoff,
    AcquireLease,
    Command,
    CompleteRun,
    FailRun,
    OpenRun,
    PrepareHandoff,
    ReconcileIntent,
    RecordIntent,
    RecordObservation,
    RecordTransition,
    ReleaseLease,
    RenewLease,
    ReserveStage,
    ResumeFrom,
    SealCheckpoint,
    Submission,
    Verdict,
)
from baton.domain.decide import context_digest
from baton.domain.events import BlobRef, IntentContext, Placement, RunPolicy
from baton.domain.handoff_document import decode_document, document_digest, state_bytes, state_digest_of
from baton.domain.stages import Stage
from baton.projections.replay import ReplayCursor
from baton.projections.resumability import Resumability, ResumePoint, classify, resume_point, summary_of

__all__ = ["LedgerTransport", "NatsTransport", "Resumed", "Transport", "Worker", "rejection_for"]

_submission_encoder = msgspec.json.Encoder()
_log = logging.getLogger("baton.worker")
_UNBOUNDED = Ceilings()
_NO_POLICY = RunPolicy()
_NOTHING = Usage()


class Transport(Protocol):
    """Carries submissions to the ledger and brings their verdicts back (or raises StoreUnavailable)."""

    def submit(self, submission: Submission) -> Verdict: ...

    def submit_many(self, submissions: Sequence[Submission]) -> list[Verdict]:
        """One verdict per submission, in order; a transport that can, appends them in one transaction."""
        ...


class LedgerTransport:
    """In-process: the worker appends straight to a store through a ``RunLedger``."""

    def __init__(self, ledger: RunLedger) -> None:
        self.ledger = ledger

    def submit(self, submission: Submission) -> Verdict:
        return self.ledger.submit(submission)

    def submit_many(self, submissions: Sequence[Submission]) -> list[Verdict]:
        return self.ledger.submit_many(submissions)


class NatsTransport:
    """Core-NATS request-reply to ``baton serve``; a private event loop thread keeps the API synchronous."""

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        import nats  # noqa: PLC0415 (only workers on the bus need the client)

        self.timeout = timeout
        self._loop = LoopThread("baton-worker-nats", timeout=timeout)
        self._nc = self._loop.run(nats.connect(servers(url), connect_timeout=timeout, error_cb=_connection_error))

    def submit(self, submission: Submission) -> Verdict:
        subject = f"baton.runs.{submission.run_id}.submit"
        try:
            reply = self._loop.run(
                self._nc.request(subject, _submission_encoder.encode(submission), timeout=self.timeout)
            )
        except Exception as exc:  # timeouts, no responders, a closed connection: the caller retries
            raise errors.StoreUnavailable(f"no verdict over NATS: {type(exc).__name__}: {exc}") from exc
        return decode_verdict(reply.data)

    def submit_many(self, submissions: Sequence[Submission]) -> list[Verdict]:
        """One request each: the service batches what arrives together into one transaction itself."""
        return [self.submit(submission) for submission in submissions]

    def close(self) -> None:
        self._loop.close(self._nc.drain())


async def _connection_error(exc: Exception) -> None:
    """One line per connection error (nats-py logs each with its traceback): a node of a cluster going
    away is an event the client recovers from by reconnecting, not a crash."""
    _log.warning("nats: %s: %s", type(exc).__name__, exc)


_REJECTIONS: dict[str, type[errors.Rejection]] = {}


def _rejection_classes(cls: type[errors.Rejection]) -> Iterator[type[errors.Rejection]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _rejection_classes(sub)


def rejection_for(verdict: Verdict) -> errors.BatonError:
    """The domain error a rejected verdict stands for (one error tree on every transport)."""
    if not _REJECTIONS:
        for cls in _rejection_classes(errors.Rejection):
            _REJECTIONS.setdefault(cls.reason, cls)
    message = verdict.message or verdict.reason or "rejected"
    if verdict.reason == "stale_epoch":
        return errors.StaleEpoch(message, current_epoch=verdict.current_epoch or 0)
    if verdict.reason == "concurrency_conflict":
        return errors.ConcurrencyConflict(message)
    if verdict.reason == "store_unavailable":
        return errors.StoreUnavailable(message)
    cls = _REJECTIONS.get(verdict.reason or "", errors.Rejection)
    return cls(message) if cls is not errors.ReplayDivergence else errors.Rejection(message)


@dataclass(frozen=True)
class Resumed:
    """What a worker resumes from: the portable checkpoint, the class with reasons, and the replay cursor."""

    checkpoint: PortableState
    resumability: Resumability
    cursor: ReplayCursor
    point: ResumePoint  # what ``resume_from`` names once the cursor is consumed, and whether it is owed


class _Renewal:
    """One run's background lease renewal: a daemon thread renewing every ``interval`` seconds.

    It ends when stopped (release, ``Worker.close``) or when a renewal is refused: the lease is
    lost (taken over, expired, the run closed) and the next append is refused, fenced. A store that
    cannot be reached is tried again at the next interval: the lease may still be saved.
    """

    def __init__(self, renew: Callable[[], object], interval: float, name: str) -> None:
        self.interval = interval
        self._renew = renew
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def stop(self) -> None:
        """Stop and wait for a renewal in flight (never called from the renewal's own thread)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._renew()
            except (errors.StoreUnavailable, errors.ConcurrencyConflict):
                continue  # retryable: the next interval tries again
            except errors.BatonError:
                return  # refused: the lease is lost, and the next append says so, fenced
            except Exception:  # a closed reader or transport: nothing left to renew through
                _log.warning("background lease renewal stopped", exc_info=True)
                return


class Worker:
    """One worker process: its name, placement, transport and (for reads) a store."""

    def __init__(
        self,
        placement: Placement,
        transport: Transport,
        reader: RunLedger,
        *,
        key: SigningKey | None = None,
        retries: int = 5,
        ttl_ms: int = 30_000,
        liveness: bool = True,
    ) -> None:
        """``key``: the private key of the principal ``placement.worker`` names, for a store that
        verifies identities; every submission is signed with it.

        ``liveness``: declare the reader's liveness session when acquiring a lease, so that a new
        worker can take the run over as soon as the store sees this process gone instead of after
        the ttl. Turn it off where the reader's connection is not this process's own (a transaction
        pooler such as PgBouncer): docs/operations.md, "Lease liveness"."""
        self.placement, self.transport, self.reader = placement, transport, reader
        self.key = key
        self.retries, self.ttl_ms = retries, ttl_ms
        self.liveness = liveness
        self._renewals: dict[str, _Renewal] = {}
        self._renewals_lock = threading.Lock()
        self.epochs: dict[str, int] = {}
        self._resumed: dict[str, Resumed] = {}  # runs being replayed, until new work says resume_from
        self._ids = itertools.count(1)
        self._stamp = f"{placement.worker}:{time.time_ns():x}"

    @property
    def name(self) -> str:
        return self.placement.worker

    # -- the one way commands leave the worker -------------------------------------------------
    def submit(self, run_id: str, command: Command, *, epoch: int | None = None) -> Verdict:
        """Submit once (retried with the same id on transport failures); raise the domain error if rejected."""
        return self._deliver([self._submission(run_id, command, epoch)])[0]

    def _submission(self, run_id: str, command: Command, epoch: int | None = None) -> Submission:
        sid = f"{self._stamp}:{next(self._ids)}"
        submission = Submission(sid, run_id, self.name, command, self.epochs.get(run_id, 0) if epoch is None else epoch)
        return submission if self.key is None else self.key.sign(submission)

    def _deliver(self, submissions: list[Submission]) -> list[Verdict]:
        """Send ``submissions`` (a batch when there are several), retrying the same ids on transport
        failures; the first rejection is raised as its domain error."""
        for attempt in range(self.retries):
            try:
                if len(submissions) == 1:
                    verdicts = [self.transport.submit(submissions[0])]
                else:
                    verdicts = self.transport.submit_many(submissions)
            except errors.StoreUnavailable:
                if attempt == self.retries - 1:
                    raise
                time.sleep(min(1.0, 0.05 * 2**attempt))  # capped: a long outage is retried every second
                continue
            for verdict in verdicts:
                if verdict.verdict == "rejected":
                    raise rejection_for(verdict)
            return verdicts
        raise errors.StoreUnavailable("unreachable")  # pragma: no cover - the loop returns or raises

    # -- recording what the worker does --------------------------------------------------------
    def open_run(
        self,
        run_id: str,
        release_id: str,
        schema: tuple[str, int],
        state: dict[str, Any],
        ceilings: Ceilings = _UNBOUNDED,
        policy: RunPolicy = _NO_POLICY,
    ) -> None:
        """Open a run whose initial task state is ``state`` (bound by its digest) under ``schema`` (name,
        version); ``policy`` says which effects need an approval and evidence (docs/identity.md)."""
        task = BlobRef(state_digest_of(state), len(state_bytes(state)))
        self.submit(run_id, OpenRun(release_id, schema[0], schema[1], task, ceilings, policy), epoch=0)

    def acquire(self, run_id: str) -> int:
        """Take the run's lease (a new epoch) and keep renewing it in the background (every third of
        the ttl) until ``release``, ``close`` or the lease is lost; returns the epoch.

        With ``liveness`` the lease declares the reader's session: if this process dies, another
        worker may take the run as soon as the store sees that session end, not after the ttl.
        """
        self.submit(run_id, AcquireLease(self.placement, self.ttl_ms, self._session()), epoch=0)
        self.epochs[run_id] = self.reader.state(run_id).epoch
        self._renew_every(run_id, self.ttl_ms / 3000)
        return self.epochs[run_id]

    def renew(self, run_id: str) -> None:
        self.submit(run_id, RenewLease(self.ttl_ms))

    def release(self, run_id: str) -> None:
        """Give the lease up; its background renewal stops first, so nothing renews it afterwards."""
        self._stop_renewal(run_id)
        self.submit(run_id, ReleaseLease())

    @contextmanager
    def heartbeat(self, run_id: str, every_s: float | None = None) -> Iterator[None]:
        """Renew the lease every ``every_s`` seconds (default: a third of the ttl) while the block runs.

        ``acquire`` already renews in the background; this is for a lease taken otherwise
        (``accept``) or a shorter interval inside the block. Afterwards renewal goes on as it did
        before the block: at the acquire's pace, or not at all.
        """
        before = self._renew_every(run_id, every_s if every_s is not None else self.ttl_ms / 3000)
        try:
            yield
        finally:
            if before is None:
                self._stop_renewal(run_id)
            else:
                self._renew_every(run_id, before, only_if_running=True)

    def close(self) -> None:
        """Stop every background renewal (the leases then last their ttl, unless released first).

        The transport and the reader belong to the caller, who closes them after this; closing the
        reader ends its liveness session.
        """
        with self._renewals_lock:
            renewals, self._renewals = list(self._renewals.values()), {}
        for renewal in renewals:
            renewal.stop()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _session(self) -> str:
        """The reader's liveness session to declare ("": none; the lease then lasts its ttl)."""
        if not self.liveness:
            return ""
        try:
            return self.reader.session()
        except errors.StoreUnavailable:
            return ""  # the acquire itself will say whether the store is reachable

    def _renew_every(self, run_id: str, interval: float, *, only_if_running: bool = False) -> float | None:
        """(Re)start the run's background renewal at ``interval``; the interval it ran at before, if any."""
        with self._renewals_lock:
            old = self._renewals.pop(run_id, None)
            previous = old.interval if old is not None and old.alive() else None
            if not only_if_running or previous is not None:
                self._renewals[run_id] = _Renewal(lambda: self.renew(run_id), interval, f"baton-renew-{run_id}")
        if old is not None:
            old.stop()
        return previous

    def _stop_renewal(self, run_id: str) -> None:
        with self._renewals_lock:
            renewal = self._renewals.pop(run_id, None)
        if renewal is not None:
            renewal.stop()

    def reserve(self, run_id: str, stage_id: str, fuel: int) -> None:
        self.submit(run_id, ReserveStage(stage_id, fuel))

    def intend(self, run_id: str, op_id: str, tool: str, context: IntentContext, *, kind: str = "effect") -> None:
        """Record the intent of ``op_id``; its idempotency key, ``RUN/OP``, is what the tool should pass on."""
        self._caught_up(run_id)
        self.submit(run_id, RecordIntent(op_id, kind, tool, context, f"{run_id}/{op_id}"))  # type: ignore[arg-type]

    def step(
        self,
        run_id: str,
        op_id: str,
        tool: str,
        context: IntentContext,
        call: Callable[[], Any],
        *,
        kind: str = "effect",
    ) -> Any:
        """One durable step: while replaying, the recorded result (``call`` is not run); after the
        prefix, the intent, ``call()`` and its observation. Returns the result either way."""
        resumed = self._resumed.get(run_id)
        if resumed is not None and not resumed.cursor.consumed:
            recorded = resumed.cursor.offer(op_id, kind, tool, context)
            if recorded is not None:
                return recorded.result
        self.intend(run_id, op_id, tool, context, kind=kind)
        result = call()
        self.observe(run_id, op_id, context, result)
        return result

    def observe(
        self, run_id: str, op_id: str, context: IntentContext, result: Any = None, *, usage: Usage = _NOTHING
    ) -> None:
        self.submit(run_id, RecordObservation(op_id, context_digest(context), "ok", result=result, usage=usage))

    def record_pure(
        self, run_id: str, op_id: str, tool: str, context: IntentContext, result: Any = None, *, usage: Usage = _NOTHING
    ) -> None:
        """Record a pure operation after it ran: its intent and ``ok`` observation in one append.

        A pure operation (a model request) changes nothing outside the run, so its intent need not be
        durable before the call: lost with a crash, it is simply asked again. The two are one
        transaction on a ledger transport; if the observation is refused (``budget_exceeded``), the
        intent alone stays, uncertain, for the resume to settle.
        """
        self._caught_up(run_id)
        intent = RecordIntent(op_id, "pure", tool, context, f"{run_id}/{op_id}")
        observation = RecordObservation(op_id, context_digest(context), "ok", result=result, usage=usage)
        self._deliver([self._submission(run_id, intent), self._submission(run_id, observation)])

    def transition(self, run_id: str, stage: Stage, state: dict[str, Any]) -> None:
        self._caught_up(run_id)
        self.submit(run_id, RecordTransition(stage, state_digest_of(state)))

    def seal(self, run_id: str, checkpoint_id: str, state: dict[str, Any]) -> None:
        """Seal ``state`` at the current boundary (its digest is what a handoff must carry)."""
        self._caught_up(run_id)
        self.submit(run_id, SealCheckpoint(checkpoint_id, state_digest_of(state)))

    def complete(self, run_id: str, summary: str = "") -> None:
        self._caught_up(run_id)
        self.submit(run_id, CompleteRun(summary))

    def fail(self, run_id: str, reason: str, detail: str = "") -> None:
        self.submit(run_id, FailRun(reason, detail))

    # -- settling what is uncertain (after a takeover: the outside world was asked) -------------
    def applied(self, run_id: str, op_id: str, evidence: str, result: Any = None, *, usage: Usage = _NOTHING) -> None:
        """The intent's effect happened: ``result`` is the observation found, ``evidence`` where."""
        self.submit(run_id, ReconcileIntent(op_id, "applied", evidence, result=result, usage=usage))

    def not_applied(self, run_id: str, op_id: str, evidence: str) -> None:
        """The effect never happened (its idempotency key may be used again)."""
        self.submit(run_id, ReconcileIntent(op_id, "not_applied", evidence))

    def abandoned(self, run_id: str, op_id: str, evidence: str) -> None:
        """Nobody can tell whether the effect happened; the run goes on without it."""
        self.submit(run_id, ReconcileIntent(op_id, "abandoned", evidence))

    def resume_from(self, run_id: str, position: int, prefix_digest: str) -> None:
        """Say the replay prefix ending at ``position`` (chain digest ``prefix_digest``) was consumed."""
        self.submit(run_id, ResumeFrom(position, prefix_digest))
        self._resumed.pop(run_id, None)

    def _caught_up(self, run_id: str) -> None:
        """Before new work: once the cursor of an owed replay is consumed, say so (``resume_from``)."""
        resumed = self._resumed.get(run_id)
        if resumed is not None and resumed.cursor.consumed:
            if resumed.point.required:
                self.resume_from(run_id, resumed.point.position, resumed.point.prefix_digest)
            self._resumed.pop(run_id, None)

    # -- resuming and moving --------------------------------------------------------------------
    def resume(self, run_id: str) -> Resumed:
        """The portable checkpoint, the class and reasons for this worker, and a streamed replay cursor."""
        fold = self.reader.resume_fold(run_id)
        summary = summary_of(fold)
        verdict = classify(summary, self.placement, self.reader.clock.now())
        cursor = self.reader.replay_cursor(run_id, summary.prefix)
        resumed = Resumed(fold.snapshot(), verdict, cursor, resume_point(summary.state, self.name))
        self._resumed[run_id] = resumed  # ``step`` replays through it; new work says ``resume_from`` after
        return resumed

    def accepted_state(self, run_id: str) -> dict[str, Any]:
        """The migrated state the run's latest handoff into this store continues from, read from the
        store's blob store and checked against the digest its ``HandoffAccepted`` binds: what a worker
        replacing a destination that died after the import continues from, with no document at hand."""
        return handoff_state.accepted_state(self.reader, run_id).state

    def hand_off(
        self, run_id: str, destination: Placement, state: dict[str, Any], *, to_version: int | None = None
    ) -> handoff.PreparedHandoff:
        """Prepare a handoff of ``run_id`` (this worker must hold it): returns the document and its digest."""
        self._caught_up(run_id)
        data = handoff.build_document(self.reader, run_id, destination=destination, state=state, to_version=to_version)
        verdict = self.submit(run_id, PrepareHandoff(data.decode(), self.ttl_ms))
        return handoff.PreparedHandoff(data, document_digest(data), verdict)

    def accept(self, document: bytes, expected_digest: str) -> int:
        """Take a run on from a handoff document (in this store, or importing it); returns the new epoch."""
        doc = decode_document(document)
        run = self.reader.state(doc.run_id)
        epoch = run.epoch if run.opened else doc.source_epoch + 1
        self.submit(doc.run_id, AcceptHandoff(document.decode(), expected_digest, self.ttl_ms), epoch=epoch)
        self.epochs[doc.run_id] = epoch
        return epoch
