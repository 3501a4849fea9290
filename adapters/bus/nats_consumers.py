"""The two NATS consumers of ``baton serve``, on the nats-py client of the FastStream broker.

FastStream owns the connection, the app's lifecycle and the AsyncAPI document; these two paths use
nats-py's public API beside it, on purpose:

* **Request-reply** (``Responder``): a plain queue-group subscription whose callback hands each
  submission straight to group commit, so concurrent submissions meet in one transaction; a
  FastStream handler would answer one message per call, with its middleware and dependency
  injection on every message.
* **Durable pull** (``DurableConsumer``): nats-py's ``fetch`` can raise a bare
  ``asyncio.TimeoutError`` when a linger window ends between its two pull requests; FastStream
  0.7's pull loop only catches ``nats.errors.TimeoutError``, so its consume task died and its
  supervisor restarted it later, stalling every durable submission meanwhile. This loop treats
  any timeout as an empty batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import ConnectionClosedError
from nats.js import api as js_api
from nats.js.errors import ServiceUnavailableError

from baton.adapters.bus.service import SubmissionService
from baton.adapters.wire import encode_verdict
from baton.domain.commands import Verdict

__all__ = ["DurableConsumer", "Responder", "durable_consumer_config"]

log = logging.getLogger("baton.bus.nats")

REPLY_HEADER = "Baton-Reply-To"
# A quiet durable stream is fetched with a window growing up to this many lingers, so the first
# durable submission after a quiet spell may wait that long (0.2 s by default) for its batch.
_QUIET_LINGERS = 4


def durable_consumer_config(*, batch: int, ack_wait: float) -> js_api.ConsumerConfig:
    """One batch in flight across the queue group, so each run's submissions append in stream order."""
    return js_api.ConsumerConfig(
        max_ack_pending=batch,
        ack_wait=ack_wait,
        ack_policy=js_api.AckPolicy.EXPLICIT,
        deliver_policy=js_api.DeliverPolicy.ALL,
    )


def _request_run_id(subject: str) -> str:
    """The run token of ``baton.runs.<run_id>.submit`` or ``baton.p.<k>.runs.<run_id>.submit``."""
    return subject.rsplit(".", 2)[-2]


def _durable_run_id(subject: str) -> str:
    """The run token of ``baton.submissions.<run_id>``."""
    return subject.rsplit(".", 1)[-1]


class Responder:
    """Core request-reply: each message is decoded in the subscription's callback and queued for group
    commit (at most ``max_in_flight`` at a time); the verdicts come back a batch at a time as replies."""

    def __init__(
        self, nc: NatsClient, service: SubmissionService, *, subjects: list[str], queue: str, max_in_flight: int
    ):
        self.nc, self.service, self.subjects, self.queue = nc, service, subjects, queue
        self.max_in_flight = max_in_flight
        self._in_flight = 0
        self._room = asyncio.Event()  # set when a full responder has room again
        self._idle = asyncio.Event()  # set when nothing is in flight
        self._idle.set()
        self._subs: dict[str, Subscription] = {}

    async def start(self) -> None:
        for subject in self.subjects:
            await self.add(subject)

    async def add(self, subject: str) -> None:
        """Answer ``subject`` too (a partition this service now owns)."""
        if subject not in self._subs:
            self._subs[subject] = await self.nc.subscribe(subject, queue=self.queue, cb=self._on_message)

    async def remove(self, subject: str) -> None:
        """Stop answering ``subject``; a drain, so messages already delivered here are answered."""
        sub = self._subs.pop(subject, None)
        if sub is not None:
            with contextlib.suppress(ConnectionClosedError):
                await sub.drain()  # type: ignore[no-untyped-call]

    async def stop(self) -> None:
        """Stop taking messages, then let the ones in flight finish (their callers are waiting)."""
        for subject in list(self._subs):
            await self.remove(subject)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await self._idle.wait()

    async def _on_message(self, msg: Msg) -> None:
        # nats-py awaits this callback before delivering the subscription's next message, so it
        # only queues the submission: the verdict comes back through ``answer`` with its batch.
        try:
            checked = self.service.check(msg.data, _request_run_id(msg.subject), msg.headers)
            if isinstance(checked, Verdict):  # bad input: answered at once, nothing stored
                if msg.reply:
                    await self.nc.publish(msg.reply, encode_verdict(checked))
                return
            while self._in_flight >= self.max_in_flight:
                self._room.clear()
                await self._room.wait()
            self._in_flight += 1
            self._idle.clear()
            self.service.enqueue(checked, self, msg.reply, msg.headers)
        except Exception:  # the service answers bad input itself; this is a lost connection or a bug
            log.exception("request-reply: no verdict sent for a message on %s", msg.subject)

    async def answer(self, answers: list[tuple[Any, Verdict]]) -> None:
        """Publish the verdicts of a batch (``SubmissionService`` calls this; each token is a reply subject).

        ``publish`` queues each reply for nats-py's flusher task, which writes everything queued in
        one go on its next turn: a batch's verdicts leave together, without a flush round trip.
        """
        try:
            lost = 0
            for reply, verdict in answers:
                if not reply:
                    continue
                try:
                    await self.nc.publish(reply, encode_verdict(verdict))
                except Exception:  # one lost reply must not cost the rest of the batch theirs
                    lost += 1
            if lost:
                log.error("request-reply: %d of %d verdicts not sent", lost, len(answers))
        finally:
            self._release(len(answers))

    def abandon(self, tokens: list[Any], exc: BaseException) -> None:
        if not isinstance(exc, asyncio.CancelledError):
            log.error("request-reply: no verdict sent for %d submissions", len(tokens), exc_info=exc)
        self._release(len(tokens))

    def _release(self, count: int) -> None:
        self._in_flight -= count
        self._room.set()
        if not self._in_flight:
            self._idle.set()


class DurableConsumer:
    """Pull batches from the submissions stream, append them in order, publish verdicts, then ack.

    A message is acknowledged only after its verdict is published, so a service killed in between
    gets it redelivered (after ``ack_wait``) to another, whose retry answers ``duplicate``.
    """

    def __init__(
        self,
        nc: NatsClient,
        service: SubmissionService,
        *,
        subject: str,
        stream: str,
        durable: str,
        config: js_api.ConsumerConfig,
        linger: float,
        before_ack: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.nc, self.service = nc, service
        self.subject, self.stream, self.durable, self.config = subject, stream, durable, config
        self.batch = config.max_ack_pending or 64
        self.linger = linger
        self.before_ack = before_ack
        self._task: asyncio.Task[None] | None = None
        self._batch: asyncio.Task[None] | None = None
        self._pull: Any = None

    async def start(self) -> None:
        js = self.nc.jetstream()
        self._pull = await js.pull_subscribe(self.subject, durable=self.durable, stream=self.stream, config=self.config)
        self._task = asyncio.create_task(self._consume(self._pull), name="baton-durable-consumer")
        self._task.add_done_callback(_log_unexpected_exit)

    async def stop(self) -> None:
        """Cancel between batches only: a batch being appended finishes and is acknowledged."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if self._batch is not None:
            await asyncio.wait({self._batch}, timeout=10)
        pull, self._pull = self._pull, None
        # unsubscribed here, or the connection's drain at broker stop waits out its timeout on it
        with contextlib.suppress(ConnectionClosedError):
            await pull.unsubscribe()

    async def _consume(self, pull: Any) -> None:
        window = self.linger
        while True:
            try:
                messages: list[Msg] = await pull.fetch(self.batch, timeout=window)
            except TimeoutError:  # also nats.errors.TimeoutError: an empty window
                # A quiet stream is polled less often: each empty fetch costs a pull request, its
                # status replies and a timeout, however busy the request-reply path is.
                window = min(window * 2, self.linger * _QUIET_LINGERS)
                continue
            except (ConnectionClosedError, ServiceUnavailableError) as exc:
                log.warning("durable submissions: %s; retrying", exc)
                await asyncio.sleep(self.linger)
                continue
            except Exception:  # any other client or server error: never let the consumer die quietly
                log.exception("durable submissions: fetch failed; retrying in 1 s")
                await asyncio.sleep(1.0)
                continue
            window = self.linger
            # shielded: a stop waits for the batch's verdicts and acks instead of abandoning them
            self._batch = asyncio.ensure_future(self._answer(messages))
            await asyncio.shield(self._batch)

    async def _answer(self, messages: list[Msg]) -> None:
        try:
            deliveries = [(m.data, _durable_run_id(m.subject), m.headers) for m in messages]
            verdicts = await self.service.handle_ordered(deliveries)
            for msg, verdict in zip(messages, verdicts, strict=True):
                reply = (msg.headers or {}).get(REPLY_HEADER)
                if reply:
                    await self.nc.publish(reply, encode_verdict(verdict))
            if self.before_ack is not None:
                await self.before_ack()
            for msg in messages:
                await msg.ack()
        except Exception:  # unacknowledged: redelivered after ack_wait, answered duplicate if committed
            log.exception("durable submissions: a batch of %d was not acknowledged", len(messages))


def _log_unexpected_exit(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("durable submissions: the consumer stopped", exc_info=task.exception())
