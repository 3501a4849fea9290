"""The worker client over Kafka (``KafkaTransport``): the same story as in-process and over NATS.

A real ``baton.Worker`` talks to a ``KafkaBus`` on Tansu (the session's Kafka-protocol broker) and a
real PostgreSQL. One service for the module (joining the consumer group takes seconds), without
the event relay: the session's events topic belongs to test_bus_kafka's store.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from bus_support import BackgroundLoop, open_run
from test_worker import story

import baton
from baton.adapters import kafka_transport
from baton.adapters.bootstrap import init_store, open_ledger
from baton.adapters.bus import KafkaBus, KafkaOptions
from baton.adapters.bus.kafka_app import SUBMISSIONS_TOPIC
from baton.adapters.eventstore import RunLedger
from baton.adapters.kafka_transport import KafkaTransport
from baton.domain import errors
from baton.domain.commands import AcquireLease, ReserveStage, Submission
from baton.domain.events import IntentContext, Placement
from tests.support.local_servers import LocalPostgres, LocalTansu

pytestmark = pytest.mark.timeout(120)

# Tansu waits the whole fetch wait on an empty partition (test_bus_kafka.py), so the default would be
# every verdict's floor (docs/benchmarks.md, "Kafka transport").
FETCH_WAIT_MS = 20
CONTEXT = IntentContext(1, "search", effect="read", arguments={"q": "incident 42"})


@dataclass
class Service:
    """The module's ledger service on Kafka, which a test may stop and start again."""

    bootstrap: str
    ledger: RunLedger
    reader: RunLedger
    loop: BackgroundLoop = field(default_factory=BackgroundLoop)
    bus: KafkaBus | None = None

    def start(self) -> None:
        self.bus = KafkaBus(self.ledger, self.bootstrap, KafkaOptions(relay=False, fetch_wait_ms=FETCH_WAIT_MS))
        self.loop.run(self.bus.start())

    def stop(self) -> None:
        bus, self.bus = self.bus, None
        if bus is not None:
            self.loop.run(bus.stop())


@pytest.fixture(scope="module")
def service(tansu_server: LocalTansu, postgres_server: LocalPostgres) -> Iterator[Service]:
    name = f"t_worker_kafka_{uuid.uuid4().hex[:12]}"
    url = postgres_server.create_database(name)
    init_store(url)
    running = Service(tansu_server.bootstrap, open_ledger(url), open_ledger(url))
    try:
        running.start()
        yield running
    finally:
        try:
            running.stop()
        finally:
            running.loop.close()
            running.ledger.close()
            running.reader.close()
            postgres_server.drop_database(name)


@pytest.fixture
def transport(service: Service) -> Iterator[KafkaTransport]:
    """A transport picked by the bus URL ``baton serve --bus`` takes."""
    opened = baton.connect_transport(f"kafka://{service.bootstrap}")
    assert isinstance(opened, KafkaTransport)
    yield opened
    opened.close()


def test_the_transport_sends_to_the_topic_the_service_consumes_and_urls_name_their_bus() -> None:
    """The worker client names the submissions topic itself (it does not import the service), and a
    URL that names neither NATS nor Kafka is refused."""
    assert kafka_transport.SUBMISSIONS_TOPIC == SUBMISSIONS_TOPIC
    with pytest.raises(ValueError, match="unsupported bus URL"):
        baton.connect_transport("http://127.0.0.1:9092")


def test_worker_over_kafka_behaves_exactly_like_in_process(service: Service, transport: KafkaTransport) -> None:
    """Given a worker over Kafka, when it opens, acquires, records steps, hands off and is fenced,
    then every verdict comes back and rejections are the domain's own errors, as in-process."""
    story(service.reader, transport)


def test_a_stale_epoch_over_kafka_raises_stale_epoch_and_stores_nothing(
    service: Service, transport: KafkaTransport
) -> None:
    """Given A released the run and B acquired it (epoch 2), when A records an intent with epoch 1,
    then A gets ``StaleEpoch`` naming epoch 2 and the log ends with B's lease."""
    run = f"kw-{uuid.uuid4().hex[:8]}"
    a = baton.Worker(Placement("a", tool_contracts=("search@1",)), transport, service.reader)
    b = baton.Worker(Placement("b", tool_contracts=("search@1",)), transport, service.reader)
    with a, b:
        a.open_run(run, "rel-1", ("coding-agent", 1), {"goal": "g"})
        assert a.acquire(run) == 1
        a.release(run)
        assert b.acquire(run) == 2
        stored = [e.type for e in service.reader.history(run)]

        with pytest.raises(errors.StaleEpoch) as stale:
            a.intend(run, "op-late", "search@1", CONTEXT)  # A still holds epoch 1

    assert stale.value.current_epoch == 2
    assert [e.type for e in service.reader.history(run)] == stored
    assert stored[-1] == "LeaseGranted"


def test_the_same_submission_sent_twice_answers_duplicate_and_the_log_holds_it_once(
    service: Service, transport: KafkaTransport
) -> None:
    """Given a submission accepted over Kafka, when it is sent again with the same id (a retry after a
    lost verdict), then the answer is ``duplicate`` at the same position and the log holds it once."""
    run = f"kw-{uuid.uuid4().hex[:8]}"
    opened = open_run(run)
    acquired = Submission(f"acquire-{run}", run, "w", AcquireLease(Placement("w"), 30_000), 0)

    first = transport.submit_many([opened, acquired])
    again = transport.submit_many([opened, acquired])

    assert [(v.verdict, v.position) for v in first] == [("accepted", 1), ("accepted", 2)]
    assert [(v.verdict, v.position) for v in again] == [("duplicate", 1), ("duplicate", 2)]
    assert [e.type for e in service.reader.history(run)] == ["RunOpened", "LeaseGranted"]


def test_a_batch_of_submissions_comes_back_in_order_one_verdict_each(
    service: Service, transport: KafkaTransport
) -> None:
    """Given 30 stage reservations sent at once, when the verdicts come back, then they are in the
    submissions' order with consecutive positions: the run's key keeps them on one partition."""
    run = f"kw-{uuid.uuid4().hex[:8]}"
    worker = baton.Worker(Placement("w"), transport, service.reader)
    with worker:
        worker.open_run(run, "rel-1", ("coding-agent", 1), {"goal": "g"})
        epoch = worker.acquire(run)
        reservations = [Submission(f"{run}-s{i}", run, "w", ReserveStage(f"s-{i}", 1), epoch) for i in range(30)]
        verdicts = transport.submit_many(reservations)

    assert [v.submission_id for v in verdicts] == [s.submission_id for s in reservations]
    assert [v.verdict for v in verdicts] == ["accepted"] * 30
    assert [v.position for v in verdicts] == list(range(3, 33))


def test_with_the_service_stopped_submissions_raise_store_unavailable_and_their_retries_append_once(
    service: Service,
) -> None:
    """Given no service consuming, when a transport and a worker submit, then both raise ``StoreUnavailable``
    (the worker after its retries, each with the same id); when a service is back, a retry of the
    same submission answers ``duplicate`` and each run's log holds its submission once."""
    run, other = f"kw-{uuid.uuid4().hex[:8]}", f"kw-{uuid.uuid4().hex[:8]}"
    impatient = KafkaTransport(service.bootstrap, timeout=1.0)
    patient = None
    try:
        worker = baton.Worker(Placement("w"), impatient, service.reader, retries=2)
        service.stop()
        try:
            with pytest.raises(errors.StoreUnavailable):
                impatient.submit(open_run(run))
            started = time.monotonic()
            with pytest.raises(errors.StoreUnavailable):
                worker.open_run(other, "rel-1", ("coding-agent", 1), {"goal": "g"})
            waited = time.monotonic() - started
            stored = [list(service.reader.history(r)) for r in (run, other)]
        finally:
            service.start()
        patient = KafkaTransport(service.bootstrap, timeout=30.0)
        retried = patient.submit(open_run(run))
        deadline = time.monotonic() + 30
        while not list(service.reader.history(other)) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        impatient.close()
        if patient is not None:
            patient.close()

    assert 2.0 <= waited < 6.0  # two tries of 1 s each, and the backoff between
    assert stored == [[], []]  # nothing was appended while no service ran
    assert (retried.verdict, retried.position) == ("duplicate", 1)  # the first try, still in the topic, came first
    assert [e.type for e in service.reader.history(run)] == ["RunOpened"]
    assert [e.type for e in service.reader.history(other)] == ["RunOpened"]  # two tries, one append
