"""The event relay on Kafka with two ``baton serve`` on one PostgreSQL: one publisher at a time.

Each test has its own Tansu (a fresh events topic: the relay resumes from what the topic holds, so
it must hold this store's events only) and its own database. Workers submit with ``KafkaTransport``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from aiokafka.structs import ConsumerRecord
from bus_support import BackgroundLoop, acquire, open_run, stage

from baton.adapters.bootstrap import init_store, open_ledger
from baton.adapters.bus import KafkaBus, KafkaOptions
from baton.adapters.bus.kafka_app import EVENTS_TOPIC
from baton.adapters.bus.relay import encode_event, event_message_id
from baton.adapters.eventstore import RunLedger
from baton.adapters.kafka_transport import KafkaTransport
from baton.domain.events import RecordedEvent
from tests.support.local_servers import LocalTansu

pytestmark = pytest.mark.timeout(180)

FETCH_WAIT_MS = 20  # Tansu waits the full fetch wait on an empty partition (test_bus_kafka.py)


@dataclass
class Cluster:
    tansu: LocalTansu
    url: str
    loop: BackgroundLoop
    ledgers: list[RunLedger]
    buses: list[KafkaBus]

    def start(self, count: int) -> None:
        """``count`` services, each with its own ledger (its own pool and relay session), started together."""
        options = KafkaOptions(fetch_wait_ms=FETCH_WAIT_MS)
        new = [KafkaBus(self.add_ledger(), self.tansu.bootstrap, options) for _ in range(count)]
        self.buses += new

        async def start_all() -> None:
            await asyncio.gather(*(bus.start() for bus in new))

        self.loop.run(start_all())

    def add_ledger(self) -> RunLedger:
        ledger = open_ledger(self.url)
        self.ledgers.append(ledger)
        return ledger

    def exit(self, bus: KafkaBus) -> None:
        """What ``baton serve`` does on SIGTERM: stop the bus, close the ledger (its relay session ends)."""
        self.loop.run(bus.stop())
        self.buses.remove(bus)
        ledger = bus.service.ledger
        assert isinstance(ledger, RunLedger)
        self.ledgers.remove(ledger)
        ledger.close()

    def leaders(self) -> list[KafkaBus]:
        return [bus for bus in self.buses if bus.relay.leading]

    def submit_runs(self, runs: list[str], stages: int) -> None:
        """Each run opened, acquired and given ``stages`` reservations, one batch per run."""
        transport = KafkaTransport(self.tansu.bootstrap, timeout=30)
        try:
            for run in runs:
                batch = [open_run(run), acquire(run, "w")] + [stage(run, "w", 1, f"s-{i}") for i in range(stages)]
                assert {v.verdict for v in transport.submit_many(batch)} == {"accepted"}
        finally:
            transport.close()


@pytest.fixture
def cluster(postgres_url: str) -> Iterator[Cluster]:
    tansu = LocalTansu()
    tansu.start()
    init_store(postgres_url)
    made = Cluster(tansu, postgres_url, BackgroundLoop(), [], [])
    try:
        yield made
    finally:
        with contextlib.ExitStack() as cleanup:
            cleanup.callback(tansu.stop)
            for ledger in made.ledgers:
                cleanup.callback(ledger.close)
            cleanup.callback(made.loop.close)
            for bus in made.buses:
                cleanup.callback(lambda bus=bus: made.loop.run(bus.stop()))


def relayed(bootstrap: str, expected: int, *, settle: float = 1.5) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record of the events topic once ``expected`` arrived, and ``settle`` seconds more (duplicates too)."""

    async def read() -> list[ConsumerRecord[bytes, bytes]]:
        consumer = AIOKafkaConsumer(
            EVENTS_TOPIC, bootstrap_servers=bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=FETCH_WAIT_MS
        )
        await consumer.start()
        records: list[ConsumerRecord[bytes, bytes]] = []
        try:
            deadline = time.monotonic() + 60
            while len(records) < expected and time.monotonic() < deadline:
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    records += batch
            quiet = time.monotonic() + settle
            while time.monotonic() < quiet:
                for batch in (await consumer.getmany(timeout_ms=200)).values():
                    records += batch
        finally:
            await consumer.stop()
        return records

    return asyncio.run(read())


def headers(record: ConsumerRecord[bytes, bytes]) -> dict[str, str]:
    return {k: v.decode() for k, v in record.headers}


def first_deliveries(records: list[ConsumerRecord[bytes, bytes]]) -> list[ConsumerRecord[bytes, bytes]]:
    """The consumer-side dedupe rule of docs/operations.md: per record key (the run id), keep a record
    only if its ``Baton-Position`` is above the highest position already kept for that key."""
    highest: dict[bytes, int] = {}
    kept = []
    for record in records:
        position = int(headers(record)["Baton-Position"])
        if position > highest.get(record.key or b"", 0):
            highest[record.key or b""] = position
            kept.append(record)
    return kept


def logged(ledger: RunLedger) -> list[str]:
    return [event_message_id(event) for _, event in ledger.all_events()]


def test_one_ledger_at_a_time_holds_the_relay_lock_until_it_closes(store_url: str) -> None:
    """Given two ledgers on one store, when both ask for the relay lock, then only the first holds it,
    keeps it when asking again, and the second gets it once the first is closed."""
    init_store(store_url)
    first, second = open_ledger(store_url), open_ledger(store_url)
    try:
        held = [first.relay_leader(), second.relay_leader(), first.relay_leader()]
        first.close()
        taken = second.relay_leader()
    finally:
        second.close()

    assert held == [True, False, True]
    assert taken is True


def assert_relayed_once(cluster: Cluster, events: int) -> None:
    """The events topic holds each of the log's ``events`` events exactly once."""
    expected = logged(cluster.ledgers[0])
    records = relayed(cluster.tansu.bootstrap, len(expected))
    ids = Counter(headers(r)["Baton-Message-Id"] for r in records)
    assert len(expected) == events
    assert sorted(ids) == sorted(expected) and set(ids.values()) == {1}


def test_two_services_on_one_store_relay_every_event_exactly_once(cluster: Cluster) -> None:
    """Given two services on one store and one broker, when workers submit 8 runs of 12 submissions,
    then one relay holds the lock and the events topic holds every event of the log exactly once."""
    cluster.start(2)
    cluster.submit_runs([f"r-{uuid.uuid4().hex[:8]}" for _ in range(8)], stages=10)

    assert_relayed_once(cluster, 8 * 12)
    assert len(cluster.leaders()) == 1


def test_when_the_publishing_service_exits_the_other_takes_over_and_nothing_is_published_twice(
    cluster: Cluster,
) -> None:
    """Given two services and a stream relayed by one, when that one exits (SIGTERM: its relay session
    ends), then the other takes the lock and relays what comes next: every event exactly once."""
    cluster.start(2)
    cluster.submit_runs([f"r-{uuid.uuid4().hex[:8]}" for _ in range(4)], stages=10)
    relayed(cluster.tansu.bootstrap, 4 * 12, settle=0)
    (leader,) = cluster.leaders()

    cluster.exit(leader)
    started = time.monotonic()
    while not cluster.leaders() and time.monotonic() - started < 10:
        time.sleep(0.05)  # the standby asks for the lock every second
    cluster.submit_runs([f"r-{uuid.uuid4().hex[:8]}" for _ in range(4)], stages=10)

    assert_relayed_once(cluster, 8 * 12)
    assert cluster.leaders() == cluster.buses and leader not in cluster.buses


def test_a_relay_resuming_a_page_left_half_published_sends_only_what_is_missing(cluster: Cluster) -> None:
    """Given a page of three runs of which only the later two runs' records reached the topic before its
    relay died, when a service starts, then it publishes the first run's events (resuming after the
    newest id present would lose them) and not the ones present: each event exactly once, in run order."""
    ledger = cluster.add_ledger()
    runs = [f"r-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    for run in runs:
        for submission in [open_run(run), acquire(run, "w"), stage(run, "w", 1, "s-0"), stage(run, "w", 1, "s-1")]:
            assert ledger.submit(submission).verdict == "accepted"
    page = list(ledger.all_events())
    asyncio.run(publish_as_a_relay(cluster.tansu.bootstrap, page[4:], after=0, count=len(page)))

    cluster.start(1)
    records = relayed(cluster.tansu.bootstrap, len(page))

    ids = [headers(r)["Baton-Message-Id"] for r in records]
    assert sorted(ids) == sorted(event_message_id(e) for _, e in page) and len(set(ids)) == len(ids) == 12
    first_run = [int(headers(r)["Baton-Position"]) for r in records if r.key == runs[0].encode()]
    assert first_run == [1, 2, 3, 4]


def test_duplicates_left_by_a_relay_cut_off_mid_page_are_dropped_by_the_consumer_rule(cluster: Cluster) -> None:
    """Given relayed events and a page published again (what a relay whose lock session ended while its
    page was in flight leaves), when a consumer keeps per run key only positions above the highest
    seen, then it reads each event exactly once and in the log's order."""
    cluster.start(1)
    cluster.submit_runs([f"r-{uuid.uuid4().hex[:8]}" for _ in range(3)], stages=4)
    events = list(cluster.ledgers[0].all_events())
    relayed(cluster.tansu.bootstrap, len(events), settle=0)
    asyncio.run(publish_as_a_relay(cluster.tansu.bootstrap, events[5:12], after=events[4][0], count=7))

    records = relayed(cluster.tansu.bootstrap, len(events) + 7, settle=0.5)
    kept = first_deliveries(records)

    assert len(records) == len(events) + 7  # the duplicates are there
    by_run: dict[str, list[RecordedEvent]] = {}
    for record in kept:
        event = msgspec.json.decode(record.value or b"", type=RecordedEvent)
        by_run.setdefault(event.run_id, []).append(event)
    for run, run_events in by_run.items():
        assert run_events == list(cluster.ledgers[0].history(run))
    assert sum(len(v) for v in by_run.values()) == len(events)


async def publish_as_a_relay(
    bootstrap: str, events: list[tuple[int, RecordedEvent]], *, after: int, count: int
) -> None:
    """Records with the headers the relay writes, for a page of ``count`` events after ``after``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        with contextlib.suppress(TopicAlreadyExistsError):  # as ``baton serve`` makes it
            await admin.create_topics([NewTopic(EVENTS_TOPIC, num_partitions=4, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for notification_id, event in events:
            record_headers = {
                "Baton-Relay-After": str(after),
                "Baton-Relay-Count": str(count),
                "Baton-Message-Id": event_message_id(event),
                "Baton-Notification-Id": str(notification_id),
                "Baton-Run-Id": event.run_id,
                "Baton-Position": str(event.position),
            }
            await producer.send_and_wait(
                EVENTS_TOPIC,
                encode_event(event),
                key=event.run_id.encode(),
                headers=[(k, v.encode()) for k, v in record_headers.items()],
            )
    finally:
        await producer.stop()
