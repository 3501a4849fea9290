"""The bus-independent core of ``baton serve``: raw submission bytes in, a verdict out.

The ledger is synchronous, so appends run in worker threads. Concurrent submissions are batched
into one ``submit_many`` call (group commit): while one transaction is in flight the next batch
gathers, so a busy service pays one store round trip per batch instead of per submission.
``submit_many`` falls back to one-by-one when any submission of the batch is rejected, so every
submission still gets exactly the verdict it would have had alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Protocol

from adapters.wire import decode_submission, rejection
from domain import errors
from domain.commands import Submission, Verdict
from domain.events import RecordedEvent

__all__ = ["Ledger", "SubmissionService"]

log = logging.getLogger("baton.bus")


class Ledger(Protocol):
    """What the bus needs from the ledger (``adapters.eventstore.RunLedger`` is one)."""

    def submit(self, submission: Submission) -> Verdict: ...

    def submit_many(self, submissions: Sequence[Submission]) -> list[Verdict]: ...

    def all_events(self, *, after: int = 0, page: int = 1000) -> Iterator[tuple[int, RecordedEvent]]: ...


class SubmissionService:
    """Decode, submit with group commit, answer; never raises for bad input or a store outage."""

    def __init__(self, ledger: Ledger, *, max_batch: int = 64, pipelines: int = 2, group_commit: bool = True) -> None:
        self.ledger = ledger
        self.max_batch = max_batch if group_commit else 1
        self.pipelines = pipelines
        self.handled = 0  # messages answered by this process (the scale-out test reads it)
        self.committed = asyncio.Event()  # set after every append: wakes the event relay early
        self._queue: asyncio.Queue[tuple[Submission, asyncio.Future[Verdict]]] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        if self._tasks:
            return
        self._queue = asyncio.Queue()
        self._tasks = [asyncio.create_task(self._batcher(), name=f"baton-batcher-{i}") for i in range(self.pipelines)]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def handle(self, raw: bytes, *, run_id: str | None = None) -> Verdict:
        """The verdict for one raw message; ``run_id`` is the run the transport addressed, if any."""
        self.handled += 1
        decoded = decode_submission(raw)
        if isinstance(decoded, Verdict):
            return decoded
        if run_id is not None and decoded.run_id != run_id:
            message = f"the message is addressed to run {run_id!r} but carries run {decoded.run_id!r}"
            return rejection(decoded.submission_id, decoded.run_id, errors.Malformed.reason, message)
        return await self.submit(decoded)

    async def submit(self, submission: Submission) -> Verdict:
        if self._queue is None:
            await self.start()
        assert self._queue is not None
        future: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        await self._queue.put((submission, future))
        return await future

    async def handle_ordered(self, messages: Sequence[tuple[bytes, str | None]]) -> list[Verdict]:
        """Verdicts for a batch from a durable stream, appended in the batch's order (one thread call)."""
        self.handled += len(messages)
        verdicts: list[Verdict | None] = []
        valid: list[tuple[int, Submission]] = []
        for raw, run_id in messages:
            decoded = decode_submission(raw)
            if isinstance(decoded, Submission) and run_id is not None and decoded.run_id != run_id:
                message = f"the message is addressed to run {run_id!r} but carries run {decoded.run_id!r}"
                decoded = rejection(decoded.submission_id, decoded.run_id, errors.Malformed.reason, message)
            if isinstance(decoded, Submission):
                valid.append((len(verdicts), decoded))
                verdicts.append(None)
            else:
                verdicts.append(decoded)
        if valid:
            answers = await asyncio.to_thread(self._submit_batch, [s for _, s in valid])
            for (index, _), verdict in zip(valid, answers, strict=True):
                verdicts[index] = verdict
            self.committed.set()
        return [v for v in verdicts if v is not None]

    async def _batcher(self) -> None:
        assert self._queue is not None
        queue = self._queue
        while True:
            batch = [await queue.get()]
            while len(batch) < self.max_batch and not queue.empty():
                batch.append(queue.get_nowait())
            try:
                verdicts = await asyncio.to_thread(self._submit_batch, [s for s, _ in batch])
            except BaseException as exc:  # a bug, or cancellation: never leave a caller waiting
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                log.exception("submission batch failed")
                continue
            for (_, future), verdict in zip(batch, verdicts, strict=True):
                if not future.done():
                    future.set_result(verdict)
            self.committed.set()

    def _submit_batch(self, batch: list[Submission]) -> list[Verdict]:
        """Runs in a thread. A store outage answers every submission ``store_unavailable`` (retryable)."""
        try:
            return [self.ledger.submit(batch[0])] if len(batch) == 1 else self.ledger.submit_many(batch)
        except errors.StoreUnavailable as exc:
            return [_unavailable(s, str(exc)) for s in batch]
        except Exception as exc:
            log.exception("store error")
            return [_unavailable(s, f"store error: {type(exc).__name__}: {exc}") for s in batch]


def _unavailable(submission: Submission, message: str) -> Verdict:
    return rejection(submission.submission_id, submission.run_id, errors.StoreUnavailable.reason, message)
