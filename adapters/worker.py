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

import asyncio
import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from baton.adapters import handoff
from baton.adapters.eventstore import RunLedger
from baton.adapters.identity import SigningKey
from baton.adapters.wire import decode_verdict
from baton.domain import errors
from baton.domain.budgets import Ceilings, Usage
from baton.domain.checkpoint import PortableState
from baton.domain.commands import (
    AcceptHandoff,
    AcquireLease,
    Command,
    OpenRun,
    PrepareHandoff,
    RecordIntent,
    RecordObservation,
    RecordTransition,
    ReleaseLease,
    RenewLease,
    ReserveStage,
    SealCheckpoint,
    Submission,
    Verdict,
)
from baton.domain.decide import context_digest
from baton.domain.events import BlobRef, IntentContext, Placement, RunPolicy
from baton.domain.handoff_document import decode_document, document_digest, state_bytes, state_digest_of
from baton.domain.stages import Stage
from baton.projections.replay import ReplayCursor
from baton.projections.resumability import Resumability, classify, summary_of

__all__ = ["LedgerTransport", "NatsTransport", "Resumed", "Transport", "Worker", "rejection_for"]

_submission_encoder = msgspec.json.Encoder()
_UNBOUNDED = Ceilings()
_NO_POLICY = RunPolicy()
_NOTHING = Usage()


class Transport(Protocol):
    """Carries one submission to the ledger and brings its verdict back (or raises StoreUnavailable)."""

    def submit(self, submission: Submission) -> Verdict: ...


class LedgerTransport:
    """In-process: the worker appends straight to a store through a ``RunLedger``."""

    def __init__(self, ledger: RunLedger) -> None:
        self.ledger = ledger

    def submit(self, submission: Submission) -> Verdict:
        return self.ledger.submit(submission)


class NatsTransport:
    """Core-NATS request-reply to ``baton serve``; a private event loop thread keeps the API synchronous."""

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        import nats  # noqa: PLC0415 (only workers on the bus need the client)

        self.timeout = timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="baton-worker-nats", daemon=True)
        self._thread.start()
        self._nc = self._run(nats.connect(url, connect_timeout=timeout))

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self.timeout + 5)

    def submit(self, submission: Submission) -> Verdict:
        subject = f"baton.runs.{submission.run_id}.submit"
        try:
            reply = self._run(self._nc.request(subject, _submission_encoder.encode(submission), timeout=self.timeout))
        except Exception as exc:  # timeouts, no responders, a closed connection: the caller retries
            raise errors.StoreUnavailable(f"no verdict over NATS: {type(exc).__name__}: {exc}") from exc
        return decode_verdict(reply.data)

    def close(self) -> None:
        self._run(self._nc.drain())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


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
    ) -> None:
        """``key``: the private key of the principal ``placement.worker`` names, for a store that
        verifies identities; every submission is signed with it."""
        self.placement, self.transport, self.reader = placement, transport, reader
        self.key = key
        self.retries, self.ttl_ms = retries, ttl_ms
        self.epochs: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._stamp = f"{placement.worker}:{time.time_ns():x}"

    @property
    def name(self) -> str:
        return self.placement.worker

    # -- the one way commands leave the worker -------------------------------------------------
    def submit(self, run_id: str, command: Command, *, epoch: int | None = None) -> Verdict:
        """Submit once (retried with the same id on transport failures); raise the domain error if rejected."""
        sid = f"{self._stamp}:{next(self._ids)}"
        submission = Submission(sid, run_id, self.name, command, self.epochs.get(run_id, 0) if epoch is None else epoch)
        if self.key is not None:
            submission = self.key.sign(submission)
        for attempt in range(self.retries):
            try:
                verdict = self.transport.submit(submission)
            except errors.StoreUnavailable:
                if attempt == self.retries - 1:
                    raise
                time.sleep(0.05 * 2**attempt)
                continue
            if verdict.verdict == "rejected":
                raise rejection_for(verdict)
            return verdict
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
        self.submit(run_id, AcquireLease(self.placement, self.ttl_ms), epoch=0)
        self.epochs[run_id] = self.reader.state(run_id).epoch
        return self.epochs[run_id]

    def renew(self, run_id: str) -> None:
        self.submit(run_id, RenewLease(self.ttl_ms))

    def release(self, run_id: str) -> None:
        self.submit(run_id, ReleaseLease())

    @contextmanager
    def heartbeat(self, run_id: str, every_s: float | None = None) -> Iterator[None]:
        """Renew the lease in the background (every third of its ttl) while the block runs."""
        stop = threading.Event()
        interval = every_s if every_s is not None else self.ttl_ms / 3000

        def beat() -> None:
            while not stop.wait(interval):
                try:
                    self.renew(run_id)
                except errors.BatonError:
                    return  # lost the lease (or the store): the next append says so, fenced

        thread = threading.Thread(target=beat, name=f"heartbeat-{run_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def reserve(self, run_id: str, stage_id: str, fuel: int) -> None:
        self.submit(run_id, ReserveStage(stage_id, fuel))

    def intend(self, run_id: str, op_id: str, tool: str, context: IntentContext, *, kind: str = "effect") -> None:
        self.submit(run_id, RecordIntent(op_id, kind, tool, context, f"{run_id}/{op_id}"))  # type: ignore[arg-type]

    def observe(
        self, run_id: str, op_id: str, context: IntentContext, result: Any = None, *, usage: Usage = _NOTHING
    ) -> None:
        self.submit(run_id, RecordObservation(op_id, context_digest(context), "ok", result=result, usage=usage))

    def transition(self, run_id: str, stage: Stage, state: dict[str, Any]) -> None:
        self.submit(run_id, RecordTransition(stage, state_digest_of(state)))

    def seal(self, run_id: str, checkpoint_id: str, state: dict[str, Any]) -> None:
        """Seal ``state`` at the current boundary (its digest is what a handoff must carry)."""
        self.submit(run_id, SealCheckpoint(checkpoint_id, state_digest_of(state)))

    # -- resuming and moving --------------------------------------------------------------------
    def resume(self, run_id: str) -> Resumed:
        """The portable checkpoint, the class and reasons for this worker, and a streamed replay cursor."""
        fold = self.reader.resume_fold(run_id)
        summary = summary_of(fold)
        verdict = classify(summary, self.placement, self.reader.clock.now())
        return Resumed(fold.snapshot(), verdict, self.reader.replay_cursor(run_id, summary.prefix))

    def hand_off(
        self, run_id: str, destination: Placement, state: dict[str, Any], *, to_version: int | None = None
    ) -> handoff.PreparedHandoff:
        """Prepare a handoff of ``run_id`` (this worker must hold it): returns the document and its digest."""
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
