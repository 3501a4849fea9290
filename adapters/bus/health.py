"""``python -m adapters.bus.health [BUS_URL]``: exit 0 when a ``baton serve`` answers on the bus.

It sends an empty submission (``{}``), which the service rejects as ``malformed`` and never stores,
and waits for that verdict: the check covers the broker, the subscription and the service loop.
The URL defaults to ``$BATON_BUS``. Used by the docker-compose healthcheck.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

from baton.adapters.bus_urls import servers
from baton.adapters.wire import decode_verdict

__all__ = ["check"]

_PROBE = b"{}"


async def check(bus_url: str, timeout: float = 5.0) -> bool:
    if bus_url.startswith("kafka://"):
        return await asyncio.wait_for(_check_kafka(bus_url.split("://", 1)[1]), timeout)
    import nats  # noqa: PLC0415 (only the NATS probe needs it)

    nc = await nats.connect(servers(bus_url), connect_timeout=timeout)
    try:
        reply = await nc.request("baton.runs.health.submit", _PROBE, timeout=timeout)
        return decode_verdict(reply.data).reason == "malformed"
    finally:
        await nc.close()


async def _check_kafka(bootstrap: str) -> bool:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: PLC0415 (Kafka probe only)

    from baton.adapters.bus.kafka_app import SUBMISSIONS_TOPIC, VERDICTS_TOPIC  # noqa: PLC0415

    correlation = uuid.uuid4().hex
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=50)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await consumer.start()
    await producer.start()
    try:
        await consumer.topics()
        tps = [TopicPartition(VERDICTS_TOPIC, p) for p in consumer.partitions_for_topic(VERDICTS_TOPIC) or ()]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        await producer.send_and_wait(
            SUBMISSIONS_TOPIC, _PROBE, key=b"health", headers=[("correlation_id", correlation.encode())]
        )
        while True:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                for record in records:
                    if dict(record.headers).get("correlation_id") == correlation.encode():
                        return decode_verdict(record.value or b"").reason == "malformed"
    finally:
        await producer.stop()
        await consumer.stop()


def main() -> int:
    url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("BATON_BUS", "")
    if not url:
        print("usage: python -m adapters.bus.health nats://HOST:PORT|kafka://HOST:PORT", file=sys.stderr)
        return 2
    try:
        return 0 if asyncio.run(check(url)) else 1
    except Exception as exc:
        print(f"unhealthy: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
