"""The worker client on Kafka: submissions to ``baton serve --bus kafka://...``, verdicts back.

Kafka has no request-reply, so each transport makes its own reply topic (``baton.verdicts.<uuid>``,
one partition, deleted again on ``close``) and reads it with a manually assigned consumer: no
consumer group, so no rebalance delay before the first verdict. Every submission goes to
``baton.submissions`` keyed by its run id (one partition per run keeps a run's submissions in
order) with a ``correlation_id`` and a ``reply_to`` header; the service copies the correlation id
onto the verdict, which resolves the future waiting for it.

Retries are idempotent because the ledger is, not the producer: a timeout or a broker error raises
``StoreUnavailable``, ``Worker`` sends the *same* submission id again, and the ledger answers
``duplicate`` if the first try was appended. A verdict that comes back for a try nobody waits for
any more is dropped. The producer waits for every in-sync replica (``acks="all"``) but is not
Kafka-idempotent: Tansu, the broker the tests run on, refuses ``InitProducerId``, and a record the
producer sends twice is answered ``duplicate`` anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Sequence
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from baton.adapters.loop_thread import LoopThread
from baton.adapters.wire import decode_verdict
from baton.domain import errors
from baton.domain.commands import Submission, Verdict

__all__ = ["SUBMISSIONS_TOPIC", "KafkaTransport"]

SUBMISSIONS_TOPIC = "baton.submissions"  # what ``baton serve`` consumes (``bus.kafka_app``)
# Tansu answers a fetch of an empty partition after the whole fetch wait, even when a record arrives
# meanwhile: the wait bounds a verdict's latency, so it is short (an idle worker fetches 50 times a second).
FETCH_WAIT_MS = 20

_log = logging.getLogger("baton.worker")
_encoder = msgspec.json.Encoder()


class KafkaTransport:
    """Submissions over Kafka with verdicts on a reply topic of its own; synchronous, like ``NatsTransport``."""

    def __init__(self, bootstrap: str, *, timeout: float = 10.0, reply_topic: str | None = None) -> None:
        """``bootstrap``: ``host:port[,host:port...]``, with or without ``kafka://``. ``reply_topic``: an
        existing topic to read verdicts from (kept on ``close``); by default a new one is made."""
        self.bootstrap = bootstrap.removeprefix("kafka://")
        self.timeout = timeout
        self.reply_topic = reply_topic or f"baton.verdicts.{uuid.uuid4().hex}"
        self._owns_topic = reply_topic is None
        self._waiting: dict[str, asyncio.Future[Verdict]] = {}
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._reader: asyncio.Task[None] | None = None
        self._loop = LoopThread("baton-worker-kafka", timeout=timeout)
        try:
            self._loop.run(self._start())
        except Exception as exc:
            self.close()
            raise errors.StoreUnavailable(f"cannot reach Kafka at {self.bootstrap}: {_described(exc)}") from exc

    def submit(self, submission: Submission) -> Verdict:
        return self.submit_many([submission])[0]

    def submit_many(self, submissions: Sequence[Submission]) -> list[Verdict]:
        """All sent at once, then every verdict awaited: the service appends what arrives together in one batch."""
        try:
            verdicts: list[Verdict] = self._loop.run(self._request(list(submissions)))
        except Exception as exc:  # a timeout, a broker error, a closed transport: the caller retries
            raise errors.StoreUnavailable(f"no verdict over Kafka: {_described(exc)}") from exc
        return verdicts

    def close(self) -> None:
        """Stop the clients and delete the reply topic this transport made; waiting submissions fail."""
        self._loop.close(self._stop())

    async def _start(self) -> None:
        async with asyncio.timeout(self.timeout):
            if self._owns_topic:
                await self._admin(lambda admin: admin.create_topics([NewTopic(self.reply_topic, 1, 1)]))
            self._producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
            await self._producer.start()
            self._consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap, enable_auto_commit=False, fetch_max_wait_ms=FETCH_WAIT_MS
            )
            await self._consumer.start()
            await self._consumer.topics()  # the cluster's metadata: the reply topic's partitions
            found = self._consumer.partitions_for_topic(self.reply_topic) or {0}
            partitions = [TopicPartition(self.reply_topic, p) for p in sorted(found)]
            self._consumer.assign(partitions)
            await self._consumer.seek_to_end(*partitions)  # only verdicts for what this transport sends
            for partition in partitions:
                await self._consumer.position(partition)  # resolved now, before the first request
        self._reader = asyncio.create_task(self._read(self._consumer), name="baton-worker-kafka-verdicts")

    async def _request(self, submissions: list[Submission]) -> list[Verdict]:
        if self._producer is None:
            raise errors.StoreUnavailable("the Kafka transport is closed")
        loop = asyncio.get_running_loop()
        ids = [uuid.uuid4().hex for _ in submissions]
        answers = [loop.create_future() for _ in submissions]
        self._waiting.update(zip(ids, answers, strict=True))
        try:
            async with asyncio.timeout(self.timeout):
                deliveries = [
                    await self._producer.send(
                        SUBMISSIONS_TOPIC,
                        _encoder.encode(submission),
                        key=submission.run_id.encode(),
                        headers=[("correlation_id", cid.encode()), ("reply_to", self.reply_topic.encode())],
                    )
                    for cid, submission in zip(ids, submissions, strict=True)
                ]
                await asyncio.gather(*deliveries)
                return list(await asyncio.gather(*answers))
        finally:
            for cid in ids:
                self._waiting.pop(cid, None)

    async def _read(self, consumer: AIOKafkaConsumer) -> None:
        """Resolve each verdict's waiting future by its correlation id (for a try given up on: dropped)."""
        while True:
            try:
                batches = await consumer.getmany(timeout_ms=1000)
            except Exception:  # the broker gone for a while: the requests waiting time out and are retried
                _log.warning("reading verdicts failed; trying again in 0.5 s", exc_info=True)
                await asyncio.sleep(0.5)
                continue
            for records in batches.values():
                for record in records:
                    cid = next((v.decode() for k, v in record.headers if k == "correlation_id"), "")
                    answer = self._waiting.get(cid)
                    if answer is None or answer.done():
                        continue
                    try:
                        answer.set_result(decode_verdict(record.value or b""))
                    except Exception as exc:  # not a verdict: that request fails, retryable
                        answer.set_exception(errors.StoreUnavailable(f"undecodable verdict: {exc}"))

    async def _stop(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
        for answer in self._waiting.values():
            if not answer.done():
                answer.set_exception(errors.StoreUnavailable("the Kafka transport closed"))
        for client in (self._consumer, self._producer):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.stop()
        self._consumer = self._producer = None
        if self._owns_topic:
            try:
                await self._admin(lambda admin: admin.delete_topics([self.reply_topic]))
            except Exception:  # a topic left behind holds only verdicts nobody reads
                _log.warning("could not delete the reply topic %s", self.reply_topic, exc_info=True)

    async def _admin(self, action: Any) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=int(self.timeout * 1000))
        await admin.start()
        try:
            with contextlib.suppress(TopicAlreadyExistsError):
                await action(admin)
        finally:
            await admin.close()


def _described(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
