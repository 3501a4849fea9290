"""``baton serve --bus kafka://...``: the ledger service on Kafka, same semantics as on NATS.

* ``baton.submissions``: submissions keyed by run id (one partition per run keeps its order),
  consumed by the consumer group ``baton-ledger``; each batch is appended in partition order and
  its offsets are committed only after the verdicts are published, so a crash before the commit
  redelivers and the retry answers ``duplicate``.
* Verdicts go to the topic in the record's ``reply_to`` header (default ``baton.verdicts``),
  keyed by run id, with the request's ``correlation_id`` header copied (Kafka has no
  request-reply of its own: a worker matches verdicts by correlation id).
* ``baton.events``: every committed event, relayed from the log, keyed by run id, with
  ``Baton-Notification-Id`` / ``Baton-Position`` / ``Baton-Message-Id`` headers and the page's
  ``Baton-Relay-After`` / ``Baton-Relay-Count``. Kafka has no conditional append, so only the
  service holding the store's relay lock publishes (``Ledger.relay_leader``); a starting relay
  completes the newest page found at the partitions' ends without resending what it holds.

An event is published twice only when the lock holder's store session ends while the holder is
alive with a page in flight (the server terminated the session, or ended it after a partition),
so that another relay resumes before that page lands, or when the producer retries a send whose
acknowledgement was lost (Tansu refuses idempotent producers). Consumers dedupe per record key:
skip a record whose ``Baton-Position`` is not above the highest seen for that run
(docs/operations.md, "Event relay on Kafka").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from aiokafka.structs import RecordMetadata
from faststream import AckPolicy, Context, FastStream
from faststream.kafka import KafkaBroker
from faststream.kafka.message import KafkaMessage
from faststream.kafka.opentelemetry import KafkaTelemetryMiddleware

from baton.adapters.bus.lifecycle import BusLifecycle
from baton.adapters.bus.relay import EventRelay, encode_event, event_message_id
from baton.adapters.bus.schemas import EventBody, SubmissionBody, VerdictBody, raw_body
from baton.adapters.bus.service import Ledger, SubmissionService
from baton.adapters.observability import Telemetry
from baton.adapters.wire import encode_verdict
from baton.domain.events import RecordedEvent

__all__ = ["CONSUMER_GROUP", "EVENTS_TOPIC", "SUBMISSIONS_TOPIC", "VERDICTS_TOPIC", "KafkaBus", "KafkaOptions"]

log = logging.getLogger("baton.bus.kafka")

CONSUMER_GROUP = "baton-ledger"
SUBMISSIONS_TOPIC = "baton.submissions"
VERDICTS_TOPIC = "baton.verdicts"
EVENTS_TOPIC = "baton.events"


@dataclass(frozen=True)
class KafkaOptions:
    group: str = CONSUMER_GROUP
    partitions: int = 4
    max_batch: int = 64
    linger_ms: int = 50
    relay: bool = True
    # The longest a fetch of the submissions waits for records. Kafka answers as soon as a record
    # arrives, so this only paces idle polls; Tansu waits it out on empty partitions, so there it is
    # every verdict's latency floor (docs/operations.md, "Event relay on Kafka").
    fetch_wait_ms: int = 500


class KafkaBus(BusLifecycle):
    """The FastStream app (``self.app``) plus the event relay beside it."""

    options: KafkaOptions

    def __init__(
        self, ledger: Ledger, bootstrap: str, options: KafkaOptions | None = None, *, telemetry: Telemetry | None = None
    ) -> None:
        self.options = options = options or KafkaOptions()
        self.bootstrap = bootstrap
        self.service = SubmissionService(ledger, max_batch=options.max_batch, telemetry=telemetry)
        # FastStream's consume span per batch; each submission's span (``Telemetry``) is its child
        spans = () if telemetry is None else (KafkaTelemetryMiddleware(tracer_provider=telemetry.tracer_provider),)
        # FastStream's own loggers colour their lines always; the service's go through logging
        self.broker = KafkaBroker(bootstrap, logger=log, log_level=logging.DEBUG, middlewares=spans)
        self.app = FastStream(self.broker, logger=None)
        self._sink = _KafkaSink(self)
        # Kafka has no conditional append: only the process holding the store's relay lock publishes
        self.relay = EventRelay(ledger, self._sink, wake=self.service.committed, leader=ledger.relay_leader)
        self._relay_task: asyncio.Task[None] | None = None
        self._register()
        self.app.on_startup(self._create_topics)
        self.app.after_startup(self._after_startup)
        self.app.on_shutdown(self._on_shutdown)

    def _register(self) -> None:
        broker, service, options = self.broker, self.service, self.options
        verdicts = broker.publisher(
            VERDICTS_TOPIC,
            title="kafka-verdicts",
            description="One verdict per submission (or on the topic in its reply_to header), with its correlation_id.",
            schema=VerdictBody,
        )
        broker.publisher(  # documentation only: the relay publishes with the broker directly
            EVENTS_TOPIC,
            title="kafka-events",
            description="Every committed event, keyed by run id, published by the one service holding the store's "
            "relay lock; headers Baton-Notification-Id, Baton-Run-Id, Baton-Position, Baton-Message-Id "
            "(<run_id>:<position>), Baton-Relay-After and Baton-Relay-Count (the page). Dedupe per key by position.",
            schema=EventBody,
        )

        @broker.subscriber(
            SUBMISSIONS_TOPIC,
            group_id=options.group,
            batch=True,
            max_records=options.max_batch,
            batch_timeout_ms=options.linger_ms,
            fetch_max_wait_ms=options.fetch_wait_ms,
            auto_offset_reset="earliest",
            ack_policy=AckPolicy.MANUAL,
            no_reply=True,  # verdicts are published explicitly, per message
            decoder=raw_body,
            title="kafka-submit",
            description="Submissions keyed by run id; verdicts go to the reply_to topic with the correlation_id.",
        )
        async def submit(bodies: list[SubmissionBody], msg: KafkaMessage = Context("message")) -> None:  # noqa: B008
            # `bodies` only types the AsyncAPI payload; the raw records carry the keys and headers.
            records = msg.raw_message
            assert isinstance(records, tuple)
            headed = [{k: v.decode() for k, v in r.headers} for r in records]
            answers = await service.handle_ordered(
                [(r.value or b"", r.key.decode() if r.key else None, h) for r, h in zip(records, headed, strict=True)]
            )
            sends: list[asyncio.Future[RecordMetadata]] = []
            for headers, verdict in zip(headed, answers, strict=True):
                reply_headers = {"correlation_id": headers.get("correlation_id", "")}
                key = (verdict.run_id or "").encode()
                topic = headers.get("reply_to") or VERDICTS_TOPIC
                data = encode_verdict(verdict)
                if topic == VERDICTS_TOPIC:
                    sent = await verdicts.publish(data, key=key, headers=reply_headers, no_confirm=True)
                else:
                    sent = await broker.publish(data, topic, key=key, headers=reply_headers, no_confirm=True)
                sends.append(sent)  # no_confirm: the future of its delivery
            await asyncio.gather(*sends)  # every verdict delivered before the batch's offsets are committed
            await msg.ack()

    async def _create_topics(self) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            existing = set(await admin.list_topics())
            wanted = [
                NewTopic(topic, num_partitions=self.options.partitions, replication_factor=1)
                for topic in (SUBMISSIONS_TOPIC, VERDICTS_TOPIC, EVENTS_TOPIC)
                if topic not in existing
            ]
            if wanted:
                with contextlib.suppress(TopicAlreadyExistsError):  # another process created them first
                    await admin.create_topics(wanted)
        finally:
            await admin.close()

    async def _close_publishers(self) -> None:
        await self._sink.close()


class _KafkaSink:
    """Publishes events keyed by run id, a page at a time; resumes after the last page it completed.

    Kafka has no conditional append, so only the process holding the store's relay lock publishes
    (``EventRelay(leader=...)``). Each record names its page: ``Baton-Relay-After`` (the notification
    id the page follows) and ``Baton-Relay-Count`` (its events). Pages are sent one after another,
    so on start only the latest page found at the partitions' ends can be incomplete (a relay that
    died mid-page); its missing events are sent and the ones present are not sent again.
    """

    def __init__(self, bus: KafkaBus) -> None:
        self.bus = bus
        self._producer: AIOKafkaProducer | None = None
        self._present: set[int] = set()  # events of an incomplete page already in the topic

    async def last_position(self) -> int:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bus.bootstrap, enable_auto_commit=False, fetch_max_wait_ms=50
        )
        await consumer.start()
        try:
            await consumer.topics()  # fetches the cluster metadata
            ids = consumer.partitions_for_topic(EVENTS_TOPIC) or set()
            tps = [TopicPartition(EVENTS_TOPIC, p) for p in sorted(ids)]
            if not tps:
                return 0
            consumer.assign(tps)
            ends = await _ends(consumer, tps)
            tails = await _read_back(consumer, ends, 1)
            if not tails:
                return 0
            newest = max(tails, key=lambda page: (page.after, page.notification_id))
            if newest.count == 0:  # written before records named their page: resume after the newest
                return max(page.notification_id for page in tails)
            records = await _read_back(consumer, ends, newest.count)
            present = {r.notification_id for r in records if r.after == newest.after and r.count > 0}
            if len(present) >= newest.count:
                return max(present)
            self._present = present
            return newest.after
        finally:
            await consumer.stop()

    async def publish(self, events: list[tuple[int, RecordedEvent]], after: int) -> bool:
        """Send a page and wait until every record of it is acknowledged by all in-sync replicas."""
        if self._producer is None:  # its own producer: events need acks="all", whatever the broker's default
            self._producer = AIOKafkaProducer(bootstrap_servers=self.bus.bootstrap, acks="all")
            await self._producer.start()
        page = {"Baton-Relay-After": str(after), "Baton-Relay-Count": str(len(events))}
        sends = []
        for notification_id, event in events:
            if notification_id in self._present:
                continue  # already in the topic, from the page a previous relay did not finish
            headers = page | {
                "Baton-Message-Id": event_message_id(event),
                "Baton-Notification-Id": str(notification_id),
                "Baton-Run-Id": event.run_id,
                "Baton-Position": str(event.position),
            }
            sends.append(
                await self._producer.send(
                    EVENTS_TOPIC,
                    encode_event(event),
                    key=event.run_id.encode(),
                    headers=[(k, v.encode()) for k, v in headers.items()],
                )
            )
        await asyncio.gather(*sends)
        if events:
            self._present = {n for n in self._present if n > events[-1][0]}
        return True

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()


@dataclass(frozen=True)
class _Relayed:
    """What a relayed record's headers say about its page (``count`` 0: written before pages were named)."""

    notification_id: int
    after: int
    count: int


async def _ends(consumer: AIOKafkaConsumer, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    """The partitions' end offsets, from a fetch's high watermark: Tansu lists the offset after the
    last record batch's first record as the end, not the offset after its last record."""
    ends: dict[TopicPartition, int] = dict(await consumer.end_offsets(tps))
    pending = {tp for tp, end in ends.items() if end > 0}
    for tp in pending:
        consumer.seek(tp, ends[tp] - 1)
    deadline = asyncio.get_running_loop().time() + 30
    while pending and asyncio.get_running_loop().time() < deadline:
        batches = await consumer.getmany(*pending, timeout_ms=500)
        for tp, records in batches.items():
            if records:
                ends[tp] = max(consumer.highwater(tp) or 0, records[-1].offset + 1, ends[tp])
                pending.discard(tp)
    if pending:
        raise TimeoutError(f"could not read the end of {EVENTS_TOPIC}: {sorted(pending)}")
    return ends


async def _read_back(consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int], last: int) -> list[_Relayed]:
    """The last ``last`` records of every partition (fewer where it holds fewer), read within 30 s."""
    pending = {tp for tp, end in ends.items() if end > 0}
    for tp in pending:
        consumer.seek(tp, max(0, ends[tp] - last))
    found: list[_Relayed] = []
    deadline = asyncio.get_running_loop().time() + 30
    while pending and asyncio.get_running_loop().time() < deadline:
        batches = await consumer.getmany(*pending, timeout_ms=500)
        for tp, records in batches.items():
            for record in records:
                if record.offset < ends[tp]:
                    headers = {k: v.decode() for k, v in record.headers}
                    notification_id = int(headers.get("Baton-Notification-Id", "0"))
                    after = int(headers.get("Baton-Relay-After", str(notification_id)))
                    found.append(_Relayed(notification_id, after, int(headers.get("Baton-Relay-Count", "0"))))
            if records and records[-1].offset >= ends[tp] - 1:
                pending.discard(tp)
    if pending:
        raise TimeoutError(f"could not read the end of {EVENTS_TOPIC}: {sorted(pending)}")
    return found
