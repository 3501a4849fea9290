"""``baton serve --bus nats://...``: the ledger service on NATS.

* ``baton.runs.<run_id>.submit``: core request-reply, served by the queue group ``baton-ledger``;
  the reply is the verdict JSON (the same line ``baton submit`` prints).
* ``baton.submissions.<run_id>`` on the JetStream stream ``BATON_SUBMISSIONS``: durable
  fire-and-forget submissions (``Nats-Msg-Id`` = submission id, so the server drops a duplicate
  publish inside its window; the ledger's submission ids catch any later one). The verdict is
  published to the subject in the ``Baton-Reply-To`` header, then the message is acknowledged: a
  service killed before the ack gets the message redelivered, and the retry answers ``duplicate``.
  One batch is in flight across the whole queue group (``max_ack_pending`` = batch size), so each
  run's submissions are appended in stream order.
* ``baton.events.<run_id>`` on ``BATON_EVENTS``: every committed event, at least once, relayed
  from the log (``relay.py``) with ``Nats-Msg-Id`` = ``<run_id>:<position>``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from faststream import FastStream
from faststream.nats import JStream, NatsBroker
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import api as js_api
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError, ServiceUnavailableError

from baton.adapters.bus.lifecycle import BusLifecycle
from baton.adapters.bus.nats_consumers import REPLY_HEADER, DurableConsumer, Responder, durable_consumer_config
from baton.adapters.bus.partitions import PartitionLeases
from baton.adapters.bus.relay import EventRelay, encode_event, event_message_id
from baton.adapters.bus.schemas import EventBody, SubmissionBody, VerdictBody
from baton.adapters.bus.service import Ledger, SubmissionService
from baton.adapters.bus_urls import servers
from baton.adapters.observability import Telemetry
from baton.domain.events import RecordedEvent

__all__ = [
    "EVENTS_STREAM",
    "QUEUE_GROUP",
    "REPLY_HEADER",
    "SUBMISSIONS_STREAM",
    "NatsBus",
    "describe_nats_consumers",
    "NatsOptions",
    "durable_subject",
    "events_subject",
    "partition_mapping",
    "partition_subject",
    "submit_subject",
]

log = logging.getLogger("baton.bus.nats")

T = TypeVar("T")

QUEUE_GROUP = "baton-ledger"
SUBMISSIONS_STREAM = "BATON_SUBMISSIONS"
EVENTS_STREAM = "BATON_EVENTS"
_ACK_TIMEOUT = 10.0
_SUBMIT = "baton.runs.{run_id}.submit"
_PARTITION = "baton.p.{partition}.runs.*.submit"
_DURABLE = "baton.submissions.{run_id}"
_EVENTS = "baton.events.{run_id}"


def partition_subject(partition: int) -> str:
    """The request-reply subject of one partition of the runs (``partition_mapping``)."""
    return _PARTITION.format(partition=partition)


def partition_mapping(count: int) -> dict[str, str]:
    """The nats-server subject mapping that spreads runs over ``count`` partitions by run id.

    Put it in the server's configuration (``mappings``) and give each ``baton serve`` the
    partitions it owns (``--partitions``): a run's requests then always reach the same service,
    whose cached state of the run stays current (docs/operations.md, Scaling out).
    """
    target = "baton.p.{{partition(" + str(count) + ",1)}}.runs.{{wildcard(1)}}.submit"
    return {submit_subject("*"): target}


def submit_subject(run_id: str) -> str:
    """Core request-reply subject of a run (a run id must be a valid subject token: no ``.*>`` or spaces)."""
    return _SUBMIT.format(run_id=run_id)


def durable_subject(run_id: str) -> str:
    return _DURABLE.format(run_id=run_id)


def events_subject(run_id: str) -> str:
    return _EVENTS.format(run_id=run_id)


@dataclass(frozen=True)
class NatsOptions:
    queue: str = QUEUE_GROUP
    max_workers: int = 64  # concurrent request-reply handlers per process (they wait on group commit)
    max_batch: int = 64  # submissions per store transaction
    group_commit: bool = True
    durable_batch: int = 64
    durable_linger: float = 0.05  # seconds a durable batch waits to fill up
    ack_wait: float = 30.0  # seconds before an unacknowledged durable submission is redelivered
    relay: bool = True
    # the run partitions this service answers (the server maps baton.runs.*.submit onto them);
    # empty: answer baton.runs.*.submit directly, in one queue group with every other service
    partitions: tuple[int, ...] = ()
    # or: share this many partitions with the other services, leased in a KV bucket (partitions.py)
    shared_partitions: int = 0
    lease_ttl: float = 3.0  # seconds before a silent service's partitions go to the others
    replicas: int = 1  # JetStream replicas of the streams and the bucket this service creates (3 in a cluster)
    # Test seam: awaited after the verdicts of a durable batch are sent and before the ack.
    before_ack: Callable[[], Awaitable[None]] | None = None


class NatsBus(BusLifecycle):
    """The FastStream app (``self.app``) plus what runs beside it: the consumers, group commit, the relay.

    The two submission paths are plain nats-py consumers (``nats_consumers.py`` says why); the
    FastStream broker owns the connection and the lifecycle.
    """

    options: NatsOptions

    def __init__(
        self, ledger: Ledger, url: str, options: NatsOptions | None = None, *, telemetry: Telemetry | None = None
    ) -> None:
        self.options = options = options or NatsOptions()
        self.service = SubmissionService(
            ledger, max_batch=options.max_batch, group_commit=options.group_commit, telemetry=telemetry
        )
        # FastStream's own loggers colour their lines always; the service's go through logging
        # named, so that a server's connection list (``/connz``) says which process is which service
        self.broker = NatsBroker(servers(url), name=f"baton-serve-{os.getpid()}", logger=log, log_level=logging.DEBUG)
        self.app = FastStream(self.broker, logger=None)
        self.relay = EventRelay(ledger, _JetStreamSink(self), wake=self.service.committed)
        self._relay_task: asyncio.Task[None] | None = None
        self._consumers: list[Responder | DurableConsumer] = []
        self.leases: PartitionLeases | None = None
        self.app.on_startup(self._declare_streams)
        self.app.after_startup(self._after_startup)
        self.app.on_shutdown(self._on_shutdown)

    async def start(self) -> None:
        await super().start()
        # a PING/PONG round trip: the server has processed every SUB of this connection, so a
        # request sent from another connection right after start() finds its responders
        await self.broker.connection.flush()

    async def _after_startup(self) -> None:
        await super()._after_startup()
        nc, options = self.broker.connection, self.options
        if options.shared_partitions:
            subjects = []  # the leases subscribe the partitions this service holds
        else:
            subjects = [partition_subject(k) for k in options.partitions] or [submit_subject("*")]
        responder = Responder(
            nc, self.service, subjects=subjects, queue=options.queue, max_in_flight=options.max_workers
        )
        self._consumers = [
            responder,
            DurableConsumer(
                nc,
                self.service,
                subject=durable_subject("*"),
                stream=SUBMISSIONS_STREAM,
                durable=options.queue,
                config=durable_consumer_config(batch=options.durable_batch, ack_wait=options.ack_wait),
                linger=options.durable_linger,
                before_ack=options.before_ack,
            ),
        ]
        for consumer in self._consumers:
            await consumer.start()
        if options.shared_partitions:
            self.leases = PartitionLeases(
                nc,
                options.shared_partitions,
                claim=lambda k: responder.add(partition_subject(k)),
                give_up=lambda k: responder.remove(partition_subject(k)),
                ttl=options.lease_ttl,
                replicas=options.replicas,
            )
            await jetstream_ready(self.leases.start)

    async def _on_shutdown(self) -> None:
        leases, self.leases = self.leases, None
        if leases is not None:
            await leases.stop()
        consumers, self._consumers = self._consumers, []
        for consumer in consumers:
            await consumer.stop()
        await super()._on_shutdown()

    async def _declare_streams(self) -> None:
        await self.broker.connect()
        js = self.broker.connection.jetstream()
        replicas = self.options.replicas
        await jetstream_ready(lambda: _ensure_stream(js, SUBMISSIONS_STREAM, durable_subject(">"), replicas))
        await jetstream_ready(lambda: _ensure_stream(js, EVENTS_STREAM, events_subject(">"), replicas))


def describe_nats_consumers(broker: NatsBroker, options: NatsOptions | None = None) -> None:
    """Declare every NATS channel of the service on ``broker``, for the AsyncAPI document only.

    Never call this on a broker that starts: the subscribers would consume beside the real ones.
    """
    options = options or NatsOptions()

    async def never_called(body: SubmissionBody) -> None:
        raise AssertionError("documentation-only subscriber")

    broker.subscriber(
        submit_subject("*"),
        queue=options.queue,
        title="nats-submit",
        description="A submission (request); the reply is its verdict. Same JSON as `baton submit`.",
    )(never_called)
    broker.subscriber(
        _PARTITION.format(partition="*"),
        queue=options.queue,
        title="nats-submit-partitioned",
        description="The same request-reply, for a service started with --partitions: the server maps "
        "baton.runs.<run_id>.submit onto baton.p.<k>.runs.<run_id>.submit (partition_mapping).",
    )(never_called)
    broker.subscriber(
        durable_subject("*"),
        stream=JStream(SUBMISSIONS_STREAM, declare=False),
        durable=options.queue,
        title="nats-submit-durable",
        description="Fire-and-forget submissions; the verdict goes to the subject in the Baton-Reply-To header.",
    )(never_called)
    broker.publisher(
        events_subject("{run_id}"),
        title="nats-events",
        description=f"Every committed event, at least once, on the JetStream stream {EVENTS_STREAM}; "
        "Nats-Msg-Id is <run_id>:<position>, headers Baton-Notification-Id, Baton-Run-Id, Baton-Position.",
        schema=EventBody,
    )
    broker.publisher(
        "{Baton-Reply-To}",
        title="nats-durable-verdicts",
        description="The verdict of a durable submission, on the subject its Baton-Reply-To header names.",
        schema=VerdictBody,
    )


async def jetstream_ready(call: Callable[[], Awaitable[T]], *, within: float = 30.0) -> T:
    """``call()``, tried again while JetStream cannot answer yet: a cluster whose node just came back,
    or that lost one, elects its stream leaders for a few seconds, and meanwhile its API answers
    "no responders" (``ServiceUnavailableError``, ``NoStreamResponseError``) or nothing at all.
    ``baton serve`` bounds the whole start (``CONNECT_WITHIN_S``); ``within`` bounds an embedded one."""
    deadline = asyncio.get_running_loop().time() + within
    delay = 0.1
    while True:
        try:
            return await call()
        except (ServiceUnavailableError, NoStreamResponseError, NatsTimeoutError) as exc:
            if asyncio.get_running_loop().time() + delay > deadline:
                raise
            log.info("JetStream not ready (%s); trying again in %.1f s", type(exc).__name__, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


async def _ensure_stream(js: Any, name: str, subjects: str, replicas: int) -> None:
    """Create the stream if missing; check it exists (FastStream only logs stream errors).

    An existing stream keeps its replicas (changing them is an operator's decision:
    ``nats stream edit``); a mismatch is logged."""
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        await js.add_stream(name=name, subjects=[subjects], storage=js_api.StorageType.FILE, num_replicas=replicas)
        info = await js.stream_info(name)
    if (info.config.num_replicas or 1) != replicas:
        log.warning("stream %s has %s replicas, not the %d asked for", name, info.config.num_replicas, replicas)


class _JetStreamSink:
    """The events stream is its own tracking position: its last message names the last event relayed.

    Each publish carries ``Nats-Expected-Last-Sequence``, so two relays (two ``baton serve``
    processes) never interleave: the one that loses a race is refused and resynchronises.
    """

    def __init__(self, bus: NatsBus) -> None:
        self.bus = bus
        self._last_seq = 0
        self._refusals = 0
        self._js: tuple[Any, Any] | None = None  # (connection, its JetStream context): made once per connection

    def _jetstream(self) -> Any:
        nc = self.bus.broker.connection
        if self._js is None or self._js[0] is not nc:
            self._js = (nc, nc.jetstream())
        return self._js[1]

    async def last_position(self) -> int:
        js = self._jetstream()
        info = await js.stream_info(EVENTS_STREAM)
        self._last_seq = info.state.last_seq
        if not self._last_seq:
            return 0
        try:
            last = await js.get_msg(EVENTS_STREAM, seq=self._last_seq)
        except NotFoundError:
            log.warning("the last message of %s is gone; relaying from the start", EVENTS_STREAM)
            return 0
        return int((last.headers or {}).get("Baton-Notification-Id", 0))

    async def publish(self, events: list[tuple[int, RecordedEvent]], after: int) -> bool:
        """Publish a page; only its last message is acknowledged.

        Every message expects the stream's last sequence to be the one before it, so the last
        message is stored only if every earlier one was (messages of one connection arrive in
        order) or another relay stored the same events in their place (both relay one log, in one
        order). The earlier messages go out as plain publishes, queued together for one write, and
        the page waits for a single JetStream acknowledgement instead of one per event.
        """
        nc = self.bus.broker.connection
        *earlier, (last_id, last) = events
        for i, (notification_id, event) in enumerate(earlier):
            await nc.publish(
                events_subject(event.run_id), encode_event(event), headers=self._headers(i, notification_id, event)
            )
        try:
            ack = await self._jetstream().publish(
                events_subject(last.run_id),
                encode_event(last),
                timeout=_ACK_TIMEOUT,
                stream=EVENTS_STREAM,
                headers=self._headers(len(earlier), last_id, last),
            )
        except APIError as exc:  # wrong last sequence: another relay got ahead, or an earlier one was refused
            self._refusals += 1
            # one refusal is a race with another relay; a run of them is a refusal for another reason
            # (payload size, a full stream), which only the stream's own error names
            level = logging.WARNING if self._refusals >= 3 else logging.INFO
            log.log(level, "event relay resynchronising after %d refusals in a row: %s", self._refusals, exc)
            return False
        except TimeoutError:  # a lost ack must not stall the relay: resynchronise from the stream
            log.warning("event relay: no publish ack after %s s; resynchronising", _ACK_TIMEOUT)
            return False
        if ack.duplicate:  # already stored by another relay: where the stream ends is unknown here
            return False
        self._last_seq = ack.seq
        self._refusals = 0
        return True

    def _headers(self, offset: int, notification_id: int, event: RecordedEvent) -> dict[str, str]:
        return {
            "Nats-Msg-Id": event_message_id(event),
            "Nats-Expected-Last-Sequence": str(self._last_seq + offset),
            "Baton-Notification-Id": str(notification_id),
            "Baton-Run-Id": event.run_id,
            "Baton-Position": str(event.position),
        }
