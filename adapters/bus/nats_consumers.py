"""The two NATS consumers of ``baton serve``, on the raw nats-py client of the FastStream broker.

FastStream still owns the connection, the app's lifecycle and the AsyncAPI document; these two
hot paths bypass its consume pipeline on purpose:

* **Request-reply** (``Responder``): FastStream's per-message middleware, dependency injection and
  logging scopes cost about 1.2 ms of CPU per submission, twice the rest of the service
  (docs/benchmarks.md, Bus). A plain subscription hands each message to a task, so concurrent
  submissions meet in one group commit.
* **Durable pull** (``DurableConsumer``): nats-py's ``fetch`` can raise a bare
  ``asyncio.TimeoutError`` when a linger window ends between its two pull requests; FastStream
  0.7's pull loop only catches ``nats.errors.TimeoutError``, so its consume task died and its
  supervisor restarted it 30 s later, stalling every durable submission meanwhile. This loop
  treats any timeout as an empty batch.
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

from adapters.bus.service import SubmissionService
from adapters.wire import encode_verdict

__all__ = ["DurableConsumer", "Responder", "durable_consumer_config"]

log = logging.getLogger("baton.bus.nats")

REPLY_HEADER = "Baton-Reply-To"


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
    """Core request-reply: one task per message (at most ``max_in_flight``), the verdict as the reply."""

    def __init__(
        self, nc: NatsClient, service: SubmissionService, *, subjects: list[str], queue: str, max_in_flight: int
    ):
        self.nc, self.service, self.subjects, self.queue = nc, service, subjects, queue
        self._slots = asyncio.Semaphore(max_in_flight)
        self._in_flight: set[asyncio.Task[None]] = set()
        self._subs: list[Subscription] = []

    async def start(self) -> None:
        for subject in self.subjects:
            self._subs.append(await self.nc.subscribe(subject, queue=self.queue, cb=self._on_message))

    async def stop(self) -> None:
        """Stop taking messages, then let the ones in flight finish (their callers are waiting).

        A drain, not an unsubscribe: messages already delivered to this client are answered too.
        """
        subs, self._subs = self._subs, []
        for sub in subs:
            with contextlib.suppress(ConnectionClosedError):
                await sub.drain()  # type: ignore[no-untyped-call]
        if self._in_flight:
            await asyncio.wait(set(self._in_flight), timeout=10)

    async def _on_message(self, msg: Msg) -> None:
        # nats-py awaits this callback before delivering the subscription's next message: hand the
        # message to a task, or submissions would be appended one at a time with no group commit.
        await self._slots.acquire()
        task = asyncio.create_task(self._answer(msg))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _answer(self, msg: Msg) -> None:
        try:
            verdict = await self.service.handle(msg.data, run_id=_request_run_id(msg.subject))
            if msg.reply:
                await self.nc.publish(msg.reply, encode_verdict(verdict))
        except Exception:  # the service answers bad input itself; this is a lost connection or a bug
            log.exception("request-reply: no verdict sent for a message on %s", msg.subject)
        finally:
            self._slots.release()


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
        while True:
            try:
                messages: list[Msg] = await pull.fetch(self.batch, timeout=self.linger)
            except TimeoutError:  # also nats.errors.TimeoutError: an empty linger window
                continue
            except (ConnectionClosedError, ServiceUnavailableError) as exc:
                log.warning("durable submissions: %s; retrying", exc)
                await asyncio.sleep(self.linger)
                continue
            except Exception:  # any other client or server error: never let the consumer die quietly
                log.exception("durable submissions: fetch failed; retrying in 1 s")
                await asyncio.sleep(1.0)
                continue
            # shielded: a stop waits for the batch's verdicts and acks instead of abandoning them
            self._batch = asyncio.ensure_future(self._answer(messages))
            await asyncio.shield(self._batch)

    async def _answer(self, messages: list[Msg]) -> None:
        try:
            verdicts = await self.service.handle_ordered([(m.data, _durable_run_id(m.subject)) for m in messages])
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
