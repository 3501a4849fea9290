"""The ledger service on a real Kafka-protocol broker (Tansu) and a real PostgreSQL.

One service for the module (joining a consumer group takes seconds), hosted on a background event
loop; each test uses its own run ids and its own reply topic, and talks Kafka with aiokafka.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from bus_support import TIMEOUT, BackgroundLoop, acquire, eventually, intent, open_run, stage, submission
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from baton.adapters.bootstrap import init_store, open_ledger
from baton.adapters.bus import KafkaBus
from baton.adapters.bus.kafka_app import EVENTS_TOPIC, SUBMISSIONS_TOPIC
from baton.adapters.eventstore import RunLedger
from baton.adapters.observability import Telemetry
from baton.adapters.observability.telemetry import SPAN_NAME
from baton.adapters.wire import MAX_SUBMISSION_BYTES, decode_verdict, encode_submission
from baton.domain.commands import ExpireLease, Submission, Verdict
from baton.domain.events import RecordedEvent
from tests.support.local_servers import LocalPostgres, LocalTansu

pytestmark = pytest.mark.timeout(180)

# Tansu answers a fetch with one record batch per partition and waits the full fetch wait on the
# empty ones: with the default 500 ms, every read of a few small batches waits that long.
FETCH_WAIT_MS = 20


@dataclass
class KafkaService:
    bootstrap: str
    ledger: RunLedger
    spans: InMemorySpanExporter


@pytest.fixture(scope="module")
def kafka_service(tansu_server: LocalTansu, postgres_server: LocalPostgres) -> Iterator[KafkaService]:
    """``KafkaBus`` on Tansu and a fresh PostgreSQL database, for the whole module."""
    name = f"t_bus_kafka_{uuid.uuid4().hex[:12]}"
    url = postgres_server.create_database(name)
    init_store(url)
    ledger = open_ledger(url)
    loop = BackgroundLoop()
    spans, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    bus = KafkaBus(ledger, tansu_server.bootstrap, telemetry=Telemetry(tracer_provider=provider, system="kafka"))
    try:
        loop.run(bus.start())
        yield KafkaService(tansu_server.bootstrap, ledger, spans)
    finally:
        try:
            loop.run(bus.stop())
        finally:
            loop.close()
            ledger.close()
            provider.shutdown()
            postgres_server.drop_database(name)


@dataclass
class Worker:
    """A Kafka client with its own reply topic: sends submissions, collects verdicts by correlation id."""

    bootstrap: str
    reply_topic: str = field(default_factory=lambda: f"replies-{uuid.uuid4().hex[:8]}")
    verdicts: dict[str, Verdict] = field(default_factory=dict)

    async def __aenter__(self) -> Worker:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(self.reply_topic, num_partitions=1, replication_factor=1)])
        finally:
            await admin.close()
        self.producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap)
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, enable_auto_commit=False, fetch_max_wait_ms=FETCH_WAIT_MS
        )
        await self.producer.start()
        try:
            await self.consumer.start()
        except BaseException:
            await self.producer.stop()
            raise
        self.consumer.assign([TopicPartition(self.reply_topic, 0)])
        await self.consumer.seek_to_beginning()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.consumer.stop()
        await self.producer.stop()

    async def send(self, item: Submission | bytes, *, key: str, correlation_id: str) -> None:
        raw = encode_submission(item) if isinstance(item, Submission) else item
        headers = [("correlation_id", correlation_id.encode()), ("reply_to", self.reply_topic.encode())]
        await self.producer.send_and_wait(SUBMISSIONS_TOPIC, raw, key=key.encode(), headers=headers)

    async def collect(self, count: int) -> dict[str, Verdict]:
        async def enough() -> bool:
            for records in (await self.consumer.getmany(timeout_ms=200)).values():
                for record in records:
                    headers = {k: v.decode() for k, v in record.headers}
                    self.verdicts[headers["correlation_id"]] = decode_verdict(record.value or b"")
            return len(self.verdicts) >= count

        await eventually(enough, timeout=60, what=f"{count} verdicts")
        return self.verdicts

    async def request(self, item: Submission | bytes, *, key: str) -> Verdict:
        cid = uuid.uuid4().hex
        await self.send(item, key=key, correlation_id=cid)
        return (await self.collect(len(self.verdicts) + 1))[cid]


def run(service: KafkaService, scenario: Any) -> None:
    async def main() -> None:
        async with Worker(service.bootstrap) as worker:
            await scenario(worker)

    asyncio.run(asyncio.wait_for(main(), 120))


def test_verdicts_come_back_by_correlation_id_in_per_run_order_and_a_duplicate_record_appends_nothing(
    kafka_service: KafkaService,
) -> None:
    """Given submissions keyed by run, when one record is sent twice, then every verdict matches and order holds."""
    run_id = f"k-{uuid.uuid4().hex[:8]}"
    items = [open_run(run_id), acquire(run_id, "w")] + [stage(run_id, "w", 1, f"s-{i}") for i in range(20)]

    async def scenario(worker: Worker) -> None:
        for n, item in enumerate(items):
            await worker.send(item, key=run_id, correlation_id=f"c{n}")
        await worker.send(items[7], key=run_id, correlation_id="again")  # a redelivered record
        verdicts = await worker.collect(len(items) + 1)
        assert [verdicts[f"c{n}"].verdict for n in range(len(items))] == ["accepted"] * len(items)
        assert [verdicts[f"c{n}"].position for n in range(len(items))] == list(range(1, len(items) + 1))
        assert (verdicts["again"].verdict, verdicts["again"].position) == ("duplicate", verdicts["c7"].position)

    run(kafka_service, scenario)
    stages = [e.body.stage_id for e in kafka_service.ledger.history(run_id) if e.type == "StageReserved"]  # type: ignore[attr-defined]
    assert stages == [f"s-{i}" for i in range(20)]


def test_a_stale_epoch_is_rejected_over_kafka_and_stores_nothing(kafka_service: KafkaService) -> None:
    """Given the lease moved from A to B, when A appends with epoch 1 over Kafka, then it is rejected stale_epoch."""
    run_id = f"k-{uuid.uuid4().hex[:8]}"

    async def scenario(worker: Worker) -> None:
        assert (await worker.request(open_run(run_id), key=run_id)).verdict == "accepted"
        assert (await worker.request(acquire(run_id, "A", ttl_ms=200), key=run_id)).verdict == "accepted"
        await asyncio.sleep(0.3)  # the lease expires on the service's clock
        assert (await worker.request(submission("x", run_id, "B", ExpireLease()), key=run_id)).verdict == "accepted"
        assert (await worker.request(acquire(run_id, "B"), key=run_id)).verdict == "accepted"
        stale = await worker.request(intent(run_id, "A", 1, "op-1"), key=run_id)
        assert (stale.verdict, stale.reason, stale.current_epoch) == ("rejected", "stale_epoch", 2)

    run(kafka_service, scenario)
    assert [e.type for e in kafka_service.ledger.history(run_id)][-1] == "LeaseGranted"


def test_bad_input_over_kafka_gets_a_rejection_with_its_reason_and_nothing_is_stored(
    kafka_service: KafkaService,
) -> None:
    """Given bad records, when each is sent, then each is rejected with its reason and the service keeps serving."""
    run_id = f"k-{uuid.uuid4().hex[:8]}"
    secret = {"api_key": "sk-live-0123456789abcdefABCDEF"}
    unknown = msgspec.to_builtins(open_run(run_id)) | {"extra": 1}
    bad = {
        "not_json": (b"{not json", "malformed"),
        "wrong_types": (b'{"submission_id": 1, "run_id": "x", "worker": "w", "command": {}}', "malformed"),
        "unknown_field": (msgspec.json.encode(unknown), "malformed"),
        "oversize": (b'{"pad":"' + b"x" * MAX_SUBMISSION_BYTES + b'"}', "payload_too_large"),
        "credential": (encode_submission(intent(run_id, "w", 0, "op-1", arguments=secret)), "credential_in_payload"),
        "keyed_to_another_run": (encode_submission(open_run("someone-else")), "malformed"),
    }

    async def scenario(worker: Worker) -> None:
        for name, (raw, reason) in bad.items():
            verdict = await worker.request(raw, key=run_id)
            assert (verdict.verdict, verdict.reason) == ("rejected", reason), name
            assert "sk-live" not in str(verdict.message), name  # the secret is never echoed
        assert (await worker.request(open_run(run_id), key=run_id)).verdict == "accepted"

    run(kafka_service, scenario)
    assert [e.type for e in kafka_service.ledger.history(run_id)] == ["RunOpened"]
    assert list(kafka_service.ledger.history("someone-else")) == []


def test_the_events_topic_holds_every_committed_event_of_the_store(kafka_service: KafkaService) -> None:
    """Given submissions over Kafka, when the relay has run, then the events topic holds each run's log in order."""
    runs = [f"k-{uuid.uuid4().hex[:8]}" for _ in range(3)]

    async def scenario(worker: Worker) -> None:
        for n, run_id in enumerate(runs):
            for m, item in enumerate([open_run(run_id), acquire(run_id, "w"), intent(run_id, "w", 1, "op")]):
                await worker.send(item, key=run_id, correlation_id=f"{n}-{m}")
        await worker.collect(9)
        consumer = AIOKafkaConsumer(
            EVENTS_TOPIC,
            bootstrap_servers=worker.bootstrap,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=FETCH_WAIT_MS,
        )
        await consumer.start()
        streamed: dict[str, list[RecordedEvent]] = {run_id: [] for run_id in runs}
        try:

            async def complete() -> bool:
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    for record in records:
                        event = msgspec.json.decode(record.value or b"", type=RecordedEvent)
                        if event.run_id in streamed:
                            streamed[event.run_id].append(event)
                return all(len(events) >= 3 for events in streamed.values())

            await eventually(complete, timeout=TIMEOUT * 2, what="the relayed events")
        finally:
            await consumer.stop()
        for run_id in runs:
            assert streamed[run_id] == list(kafka_service.ledger.history(run_id))

    run(kafka_service, scenario)


def test_each_kafka_submission_is_a_span_under_faststreams_consume_span(kafka_service: KafkaService) -> None:
    """Given the service with a tracer provider, when a submission is answered over Kafka, then its
    span carries the run, submission, verdict and position, a child of FastStream's consume span."""
    run_id = f"k-{uuid.uuid4().hex[:8]}"

    async def scenario(worker: Worker) -> None:
        assert (await worker.request(open_run(run_id), key=run_id)).verdict == "accepted"

    run(kafka_service, scenario)

    def ours() -> list[ReadableSpan]:
        finished = kafka_service.spans.get_finished_spans()
        return [s for s in finished if s.name == SPAN_NAME and (s.attributes or {}).get("baton.run_id") == run_id]

    def parent_ended() -> bool:  # FastStream ends its consume span after the handler, so after the verdict left
        spans = ours()
        ended = {s.context.span_id for s in kafka_service.spans.get_finished_spans() if s.context is not None}
        return bool(spans) and spans[0].parent is not None and spans[0].parent.span_id in ended

    asyncio.run(eventually(_async(parent_ended), timeout=10, what="FastStream's consume span to end"))
    finished = kafka_service.spans.get_finished_spans()
    spans = ours()

    assert len(spans) == 1
    span = spans[0]
    assert (span.attributes or {})["baton.submission_id"] == f"open-{run_id}"
    assert (span.attributes or {})["baton.verdict"] == "accepted"
    assert (span.attributes or {})["baton.position"] == 1
    assert (span.attributes or {})["messaging.system"] == "kafka"
    parents = {s.context.span_id: s for s in finished if s.context is not None}
    assert span.parent is not None and span.parent.span_id in parents
    assert SUBMISSIONS_TOPIC in parents[span.parent.span_id].name  # FastStream's "baton.submissions process"


def _async(condition: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return condition()

    return check
