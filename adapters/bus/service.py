"""The bus-independent core of ``baton serve``: raw submission bytes in, a verdict out.

The ledger is synchronous, so appends run in a ledger thread. Concurrent submissions are batched
into one ``submit_many`` call (group commit): while one transaction is in flight the next batch
gathers, so a busy service pays one store round trip per batch instead of per submission.
``submit_many`` falls back to one-by-one when any submission of the batch is rejected, so every
submission still gets exactly the verdict it would have had alone.

A transport hands a decoded submission over with ``enqueue`` and gets the verdicts of a whole batch
back in one ``Answers.answer`` call: no task, future or asyncio queue per message. The ledger
thread takes the submissions off a thread-safe queue itself, so a busy service pays one wake-up of
the event loop per batch. ``submit`` and ``handle`` wrap the same path in a future for callers that
want one verdict back.

One ledger thread by default: a second one lets a batch be decided while another commits, but it
made the batches smaller (more transactions, handoffs and GIL switches) for no more throughput,
since the appends serialise on the store's table lock anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from baton.adapters.wire import decode_submission, rejection
from baton.domain import errors
from baton.domain.commands import Submission, Verdict
from baton.domain.events import RecordedEvent

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from baton.adapters.observability import Telemetry

__all__ = ["Answers", "Delivery", "Ledger", "SubmissionService"]

# A message from a durable stream: its bytes, the run its subject or key names, its headers.
Delivery = tuple[bytes, str | None, Mapping[str, str] | None]

log = logging.getLogger("baton.bus")


class Ledger(Protocol):
    """What the bus needs from the ledger (``adapters.eventstore.RunLedger`` is one)."""

    def submit(self, submission: Submission) -> Verdict: ...

    def submit_many(self, submissions: Sequence[Submission]) -> list[Verdict]: ...

    def all_events(self, *, after: int = 0, page: int = 1000) -> Iterator[tuple[int, RecordedEvent]]: ...

    def relay_leader(self) -> bool:
        """Whether this process is the one event relay now (taking the role if free): a lock the store
        holds for this process, so that a bus with no conditional append (Kafka) gets one publisher."""
        ...

    @property
    def lease_takeovers(self) -> int: ...


class Answers(Protocol):
    """Where the verdicts of enqueued submissions go, a batch at a time, with the token given to ``enqueue``."""

    async def answer(self, answers: list[tuple[Any, Verdict]]) -> None: ...

    def abandon(self, tokens: list[Any], exc: BaseException) -> None:
        """The batch failed without verdicts (a bug, or the service stopping)."""
        ...


class _Futures:
    """``Answers`` for ``submit``: each token is the future its caller awaits."""

    async def answer(self, answers: list[tuple[Any, Verdict]]) -> None:
        for future, verdict in answers:
            if not future.done():
                future.set_result(verdict)

    def abandon(self, tokens: list[Any], exc: BaseException) -> None:
        for future in tokens:
            if not future.done():
                future.set_exception(exc)


_FUTURES = _Futures()


class SubmissionService:
    """Decode, submit with group commit, answer; never raises for bad input or a store outage."""

    def __init__(
        self,
        ledger: Ledger,
        *,
        max_batch: int = 64,
        pipelines: int = 1,
        group_commit: bool = True,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.ledger = ledger
        self.telemetry = telemetry  # spans and metrics (``baton serve``); None: nothing measured
        self.max_batch = max_batch if group_commit else 1
        self.pipelines = pipelines
        self.handled = 0  # messages answered by this process (the scale-out test reads it)
        self.committed = asyncio.Event()  # set after every append: wakes the event relay early
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deliveries: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        if self._threads:
            return
        self._loop = loop = asyncio.get_running_loop()
        self._threads = [
            threading.Thread(target=self._pipeline, args=(loop,), name=f"baton-ledger-{i}", daemon=True)
            for i in range(self.pipelines)
        ]
        for thread in self._threads:
            thread.start()

    async def stop(self) -> None:
        """Let the batches being appended finish; submissions not yet taken get ``CancelledError``."""
        threads, self._threads = self._threads, []
        if not threads:
            return
        left = self._untaken()
        for _ in threads:
            self._jobs.put(None)
        for thread in threads:
            await asyncio.get_running_loop().run_in_executor(None, thread.join, 10)
        left += self._untaken()  # the stop signals too
        for thread in threads:
            if thread.is_alive():  # still in a slow store after the join's wait: its stop signal again
                self._jobs.put(None)
        if left:
            self._abandon(left, asyncio.CancelledError())
        if self._deliveries:
            await asyncio.wait(set(self._deliveries), timeout=10)

    def _untaken(self) -> list[_Job]:
        """Empty the queue: the submissions no ledger thread has taken (stop signals dropped)."""
        left: list[_Job] = []
        with contextlib.suppress(queue.Empty):
            while True:
                job = self._jobs.get_nowait()
                if job is not None:
                    left.append(job)
        return left

    def check(
        self, raw: bytes, run_id: str | None = None, headers: Mapping[str, str] | None = None
    ) -> Submission | Verdict:
        """The submission in ``raw``, or its rejection; ``run_id`` is the run the transport addressed, if any."""
        self.handled += 1
        decoded = decode_submission(raw)
        if run_id is not None and isinstance(decoded, Submission) and decoded.run_id != run_id:
            message = f"the message is addressed to run {run_id!r} but carries run {decoded.run_id!r}"
            decoded = rejection(decoded.submission_id, decoded.run_id, errors.Malformed.reason, message)
        if isinstance(decoded, Verdict) and self.telemetry is not None:
            self.telemetry.refused(decoded, headers)
        return decoded

    def enqueue(
        self, submission: Submission, answers: Answers, token: Any, headers: Mapping[str, str] | None = None
    ) -> None:
        """Submit with group commit; ``answers`` gets the verdict with ``token`` (after ``start``)."""
        span = None if self.telemetry is None else self.telemetry.received(submission, headers)
        self._jobs.put((submission, answers, token, span))

    async def handle(self, raw: bytes, *, run_id: str | None = None) -> Verdict:
        """The verdict for one raw message; ``run_id`` is the run the transport addressed, if any."""
        decoded = self.check(raw, run_id)
        if isinstance(decoded, Verdict):
            return decoded
        return await self.submit(decoded)

    async def submit(self, submission: Submission) -> Verdict:
        if not self._threads:
            await self.start()
        future: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self.enqueue(submission, _FUTURES, future)
        return await future

    async def handle_ordered(self, messages: Sequence[Delivery]) -> list[Verdict]:
        """Verdicts for a batch from a durable stream, appended in the batch's order (one thread call)."""
        verdicts: list[Verdict | None] = []
        valid: list[tuple[int, Submission]] = []
        telemetry = self.telemetry
        spans: list[Span] = []
        for raw, run_id, headers in messages:
            decoded = self.check(raw, run_id, headers)
            if isinstance(decoded, Submission):
                valid.append((len(verdicts), decoded))
                verdicts.append(None)
                if telemetry is not None:
                    spans.append(telemetry.received(decoded, headers))
            else:
                verdicts.append(decoded)
        if valid:
            loop = asyncio.get_running_loop()
            answers = await loop.run_in_executor(None, self._submit_batch, [s for _, s in valid])
            for (index, _), verdict in zip(valid, answers, strict=True):
                verdicts[index] = verdict
            self.committed.set()
            if telemetry is not None:
                telemetry.answered(spans, answers)
        return [v for v in verdicts if v is not None]

    def _pipeline(self, loop: asyncio.AbstractEventLoop) -> None:
        """A ledger thread: take whatever is queued (up to ``max_batch``), append it, hand the verdicts back.

        The thread drains the queue itself, so a busy service pays one wake-up of the event loop per
        batch and none per submission.
        """
        jobs = self._jobs
        stopping = False
        while not stopping:
            job = jobs.get()
            if job is None:
                return
            batch = [job]
            with contextlib.suppress(queue.Empty):
                while len(batch) < self.max_batch:
                    job = jobs.get_nowait()
                    if job is None:
                        stopping = True
                        break
                    batch.append(job)
            try:
                verdicts = self._submit_batch([job[0] for job in batch])
            except BaseException as exc:  # never leave a caller waiting, even on the way out
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._abandon, batch, exc)
                raise
            try:
                loop.call_soon_threadsafe(self._delivered, batch, verdicts)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                return

    def _delivered(self, batch: list[_Job], verdicts: list[Verdict]) -> None:
        """In the event loop: one task answers the verdicts of one batch."""
        self.committed.set()
        task = asyncio.ensure_future(_deliver(batch, verdicts, self.telemetry))
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)

    def _submit_batch(self, batch: list[Submission]) -> list[Verdict]:
        """Runs in a thread. A store outage answers every submission ``store_unavailable`` (retryable)."""
        started = time.perf_counter()
        try:
            verdicts = [self.ledger.submit(batch[0])] if len(batch) == 1 else self.ledger.submit_many(batch)
        except errors.StoreUnavailable as exc:
            verdicts = [_unavailable(s, str(exc)) for s in batch]
        except Exception as exc:
            log.exception("store error")
            verdicts = [_unavailable(s, f"store error: {type(exc).__name__}: {exc}") for s in batch]
        if self.telemetry is not None:
            self.telemetry.appended(time.perf_counter() - started, len(batch))
        return verdicts

    def _abandon(self, batch: list[_Job], exc: BaseException) -> None:
        groups: dict[Answers, list[Any]] = {}
        for _, answers, token, _ in batch:
            groups.setdefault(answers, []).append(token)
        for answers, tokens in groups.items():
            answers.abandon(tokens, exc)
        if self.telemetry is not None:
            self.telemetry.abandoned([span for *_, span in batch if span is not None], exc)


# a submission, where its verdict goes (and with which token), its span when measured
_Job = tuple[Submission, Answers, Any, "Span | None"]


async def _deliver(batch: list[_Job], verdicts: list[Verdict], telemetry: Telemetry | None) -> None:
    """One ``answer`` call per destination (nearly always one: the responder)."""
    first = batch[0][1]
    if all(job[1] is first for job in batch):
        groups = {first: [(job[2], v) for job, v in zip(batch, verdicts, strict=True)]}
    else:
        groups = {}
        for (_, answers, token, _), verdict in zip(batch, verdicts, strict=True):
            groups.setdefault(answers, []).append((token, verdict))
    for answers, items in groups.items():
        try:
            await answers.answer(items)
        except Exception:  # a lost connection or a bug: the other destinations still get theirs
            log.exception("verdicts of %d submissions not delivered", len(items))
    if telemetry is not None:
        telemetry.answered([job[3] for job in batch if job[3] is not None], verdicts)


def _unavailable(submission: Submission, message: str) -> Verdict:
    return rejection(submission.submission_id, submission.run_id, errors.StoreUnavailable.reason, message)
