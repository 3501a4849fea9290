"""NATS authentication as defence in depth (docs/operations.md, "NATS authentication"): given a
nats-server configured with users and subject permissions, an unauthenticated client cannot even
connect, and a worker's user may publish submissions but nothing else."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import nats
import pytest
from nats.errors import NoServersError

from tests.support.local_servers import LocalNats

USERS = """
authorization {
  users = [
    { user: worker, password: "worker-secret",
      permissions: { publish: ["baton.runs.*.submit"], subscribe: ["_INBOX.>"] } }
    { user: baton, password: "baton-secret", permissions: { publish: [">"], subscribe: [">"] } }
  ]
}
"""


@pytest.fixture(scope="module")
def guarded() -> Iterator[LocalNats]:
    with LocalNats(config=USERS) as server:
        yield server


def test_an_unauthenticated_client_cannot_connect(guarded: LocalNats) -> None:
    async def scenario() -> None:
        with pytest.raises((NoServersError, nats.errors.Error, OSError)):
            await nats.connect(guarded.url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)

    asyncio.run(scenario())


def test_a_worker_may_publish_submissions_only(guarded: LocalNats) -> None:
    async def scenario() -> None:
        host = guarded.url.removeprefix("nats://")
        violations: list[str] = []

        async def on_error(exc: Exception) -> None:
            violations.append(str(exc))

        service = await nats.connect(f"nats://baton:baton-secret@{host}")
        worker = await nats.connect(f"nats://worker:worker-secret@{host}", error_cb=on_error)
        try:
            received = await service.subscribe("baton.>")
            await service.flush()  # the server has the subscription before the worker publishes
            await worker.publish("baton.runs.r1.submit", b"{}")
            await worker.publish("baton.events.r1", b"forged")
            await worker.flush()
            message = await received.next_msg(timeout=2)
            assert message.subject == "baton.runs.r1.submit"
            with pytest.raises(nats.errors.TimeoutError):
                await received.next_msg(timeout=0.5)  # the forged event never arrives
            await asyncio.sleep(0.2)
            assert any("permissions violation" in v.lower() for v in violations), violations
        finally:
            await worker.close()
            await service.close()

    asyncio.run(scenario())
