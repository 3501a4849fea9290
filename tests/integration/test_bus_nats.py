"""The ledger service on a real ``nats-server -js`` and a real PostgreSQL.

Each test runs one scenario on one event loop: the bus (``NatsBus``) and its clients side by side;
the ledger's appends run in threads, as in ``baton serve``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import multiprocessing
from collections.abc import AsyncIterator, Coroutine, Mapping
from typing import Any

import msgspec
import nats
import pytest
from bus_support import (
    TIMEOUT,
    acquire,
    doomed_service,
    eventually,
    intent,
    open_run,
    request,
    stage,
    stream_events,
    submission,
)
from nats.aio.client import Client as NatsClient
from nats.js.errors import NotFoundError

from baton.adapters.bootstrap import init_store, open_ledger, register
from baton.adapters.bus import NatsBus, NatsOptions
from baton.adapters.bus.nats_app import REPLY_HEADER, durable_subject, partition_mapping
from baton.adapters.eventstore import RunLedger
from baton.adapters.identity import SigningKey
from baton.adapters.wire import MAX_SUBMISSION_BYTES, decode_verdict, encode_submission
from baton.domain.commands import AddPrincipal, ExpireLease, OpenRun, Submission, Verdict
from baton.domain.events import BlobRef
from tests.support.local_servers import LocalNats

pytestmark = pytest.mark.timeout(120)


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 90))


@contextlib.asynccontextmanager
async def serving(
    store_url: str, nats_url: str, options: NatsOptions | None = None
) -> AsyncIterator[tuple[NatsBus, RunLedger]]:
    ledger = open_ledger(store_url)
    bus = NatsBus(ledger, nats_url, options)
    try:
        async with bus:
            yield bus, ledger
    finally:
        ledger.close()


@contextlib.asynccontextmanager
async def client(nats_url: str) -> AsyncIterator[NatsClient]:
    nc = await nats.connect(nats_url)
    try:
        yield nc
    finally:
        await nc.close()


async def publish_durable(nc: NatsClient, item: Any, reply: str, *, msg_id: str | None = None) -> Any:
    raw = encode_submission(item)
    headers = {"Nats-Msg-Id": msg_id or item.submission_id, REPLY_HEADER: reply}
    return await nc.jetstream().publish(durable_subject(item.run_id), raw, headers=headers, timeout=TIMEOUT)


def event_count(ledger: RunLedger, run_id: str) -> int:
    return sum(1 for _ in ledger.history(run_id))


def test_request_reply_answers_accepted_then_duplicate_at_the_same_position(bus_store_url: str, nats_url: str) -> None:
    """Given a serving bus, when a submission is sent twice by request-reply, then the retry is a duplicate."""

    async def scenario() -> None:
        async with serving(bus_store_url, nats_url) as (_, ledger), client(nats_url) as nc:
            first = await request(nc, open_run("r1"))
            again = await request(nc, open_run("r1"))
            assert (first.verdict, first.position) == ("accepted", 1)
            assert (again.verdict, again.position, again.submission_id) == ("duplicate", 1, "open-r1")
            assert event_count(ledger, "r1") == 1

    run(scenario())


def test_concurrent_requests_get_each_its_own_verdict_and_reach_the_stream_in_log_order(
    bus_store_url: str, nats_url: str
) -> None:
    """Given concurrent requests, then each gets its own verdict and the stream holds the log once, in order."""

    async def scenario() -> None:
        async with serving(bus_store_url, nats_url) as (_, ledger), client(nats_url) as nc:
            verdicts = await asyncio.gather(*(request(nc, open_run(f"r{i}")) for i in range(5)))
            assert [(v.verdict, v.run_id) for v in verdicts] == [("accepted", f"r{i}") for i in range(5)]

            async def relayed() -> bool:
                return len(await stream_events(nc)) >= 5

            await eventually(relayed, what="the relay to publish the five events")
            assert [e for _, e in await stream_events(nc)] == [e for _, e in ledger.all_events()]

    run(scenario())


def test_a_started_bus_has_frozen_the_startup_heap_once_per_process(bus_store_url: str, nats_url: str) -> None:
    """Given a started bus, the heap alive at its start is frozen, and a second bus freezes nothing more."""

    async def scenario() -> None:
        async with serving(bus_store_url, nats_url) as (_, ledger), client(nats_url) as nc:
            frozen = gc.get_freeze_count()
            assert frozen > 0  # a full collection never walks these objects again
            async with serving(bus_store_url, nats_url, NatsOptions(queue="second", relay=False)):
                assert gc.get_freeze_count() == frozen
            assert (await request(nc, open_run("r1"))).verdict == "accepted"
            assert event_count(ledger, "r1") == 1

    run(scenario())


def test_a_stale_epoch_is_rejected_over_the_bus_and_stores_nothing(bus_store_url: str, nats_url: str) -> None:
    """Given the lease moved from A to B, when A appends with its old epoch, then it is rejected stale_epoch."""

    async def scenario() -> None:
        async with serving(bus_store_url, nats_url) as (_, ledger), client(nats_url) as nc:
            await request(nc, open_run("r1"))
            assert (await request(nc, acquire("r1", "A", ttl_ms=200))).verdict == "accepted"
            await asyncio.sleep(0.3)  # the lease expires on the service's clock
            assert (await request(nc, submission("x1", "r1", "B", ExpireLease()))).verdict == "accepted"
            assert (await request(nc, acquire("r1", "B"))).verdict == "accepted"
            before = event_count(ledger, "r1")
            stale = await request(nc, intent("r1", "A", 1, "op-1"))
            assert (stale.verdict, stale.reason, stale.current_epoch) == ("rejected", "stale_epoch", 2)
            assert event_count(ledger, "r1") == before

    run(scenario())


BAD_INPUTS = {
    "not_json": (b"{not json", "malformed"),
    "wrong_types": (b'{"submission_id": 1, "run_id": "r1", "worker": "w", "command": {}}', "malformed"),
    "unknown_field": (
        json.dumps({**msgspec.to_builtins(open_run("r1")), "submission_id": "u1", "extra": 1}).encode(),
        "malformed",
    ),
    "oversize": (b'{"submission_id":"big","pad":"' + b"x" * MAX_SUBMISSION_BYTES + b'"}', "payload_too_large"),
    "credential": (
        encode_submission(intent("r1", "w", 0, "op-1", arguments={"api_key": "sk-live-0123456789abcdefABCDEF"})),
        "credential_in_payload",
    ),
    "addressed_to_another_run": (encode_submission(open_run("r2")), "malformed"),
}


def test_bad_input_gets_a_rejection_with_its_reason_and_the_service_keeps_serving(
    bus_store_url: str, nats_url: str
) -> None:
    """Given bad messages, when each is sent, then each is rejected with its reason, nothing stored, service alive."""

    async def scenario() -> None:
        async with serving(bus_store_url, nats_url) as (_, ledger), client(nats_url) as nc:
            for name, (raw, reason) in BAD_INPUTS.items():
                verdict = await request(nc, raw, run_id="r1")
                assert (verdict.verdict, verdict.reason) == ("rejected", reason), name
                assert "sk-live" not in str(verdict.message), name  # the secret is never echoed
            assert list(ledger.all_events()) == []
            assert (await request(nc, open_run("r1"))).verdict == "accepted"

    run(scenario())


def test_durable_submission_is_answered_on_the_reply_subject_and_a_republish_is_deduplicated(
    bus_store_url: str, nats_url: str
) -> None:
    """Given the JetStream path, when a submission is published twice, then one append and the same verdict."""

    async def scenario() -> None:
        async with serving(bus_store_url, nats_url) as (_, ledger), client(nats_url) as nc:
            inbox = nc.new_inbox()
            replies = await nc.subscribe(inbox)
            await publish_durable(nc, open_run("r1"), inbox)
            first = decode_verdict((await replies.next_msg(TIMEOUT)).data)
            again = await publish_durable(nc, open_run("r1"), inbox)
            assert again.duplicate  # the server's window drops it: no handler call, no second verdict
            await publish_durable(nc, open_run("r1"), inbox, msg_id="beyond-the-window")
            redelivered = decode_verdict((await replies.next_msg(TIMEOUT)).data)
            assert (first.verdict, first.position) == ("accepted", 1)
            assert (redelivered.verdict, redelivered.position) == ("duplicate", 1)
            assert event_count(ledger, "r1") == 1

    run(scenario())


def test_a_consumer_killed_before_ack_gets_the_message_redelivered_and_answers_duplicate(
    bus_store_url: str, nats_url: str
) -> None:
    """Given a service SIGKILLed between its commit and its ack, when another serves, then the retry is a duplicate."""
    ctx = multiprocessing.get_context("spawn")
    committed = ctx.Event()
    doomed = ctx.Process(target=doomed_service, args=(bus_store_url, nats_url, committed), daemon=True)

    async def scenario() -> None:
        async with client(nats_url) as nc:
            inbox = nc.new_inbox()
            replies = await nc.subscribe(inbox)

            async def streams_exist() -> bool:
                try:
                    await nc.jetstream().stream_info("BATON_SUBMISSIONS")
                except NotFoundError:
                    return False
                return True

            await eventually(streams_exist, what="the doomed service to declare its streams")
            await publish_durable(nc, open_run("r1"), inbox)
            assert await asyncio.to_thread(committed.wait, TIMEOUT), "the doomed service never committed"
            first = decode_verdict((await replies.next_msg(TIMEOUT)).data)
            doomed.kill()  # SIGKILL, between commit and ack
            await asyncio.to_thread(doomed.join, TIMEOUT)
            async with serving(bus_store_url, nats_url, NatsOptions(ack_wait=2.0)) as (_, ledger):
                retry = decode_verdict((await replies.next_msg(TIMEOUT)).data)
                assert (first.verdict, first.position) == ("accepted", 1)
                assert (retry.verdict, retry.position, retry.submission_id) == ("duplicate", 1, "open-r1")
                assert event_count(ledger, "r1") == 1

    doomed.start()
    try:
        run(scenario())
    finally:
        if doomed.is_alive():
            doomed.kill()
        doomed.join(10)


def test_durable_submissions_of_a_run_are_appended_in_publish_order(bus_store_url: str, nats_url: str) -> None:
    """Given fire-and-forget submissions of two runs published back to back, then each run's log keeps publish order."""

    async def scenario() -> None:
        async with serving(bus_store_url, nats_url) as (_, ledger), client(nats_url) as nc:
            inbox = nc.new_inbox()
            verdicts: list[Verdict] = []

            async def collect(msg: Any) -> None:
                verdicts.append(decode_verdict(msg.data))

            await nc.subscribe(inbox, cb=collect)
            items = [open_run("r1"), open_run("r2"), acquire("r1", "w"), acquire("r2", "w")]
            items += [stage(run, "w", 1, f"s-{i}") for i in range(40) for run in ("r1", "r2")]
            js = nc.jetstream()
            acks = [
                await js.publish_async(
                    durable_subject(item.run_id),
                    encode_submission(item),
                    headers={"Nats-Msg-Id": f"{item.run_id}/{item.submission_id}", REPLY_HEADER: inbox},
                )
                for item in items
            ]
            await asyncio.gather(*acks)

            async def all_answered() -> bool:
                return len(verdicts) == len(items)

            await eventually(all_answered, what="a verdict for every durable submission")
            assert {v.verdict for v in verdicts} == {"accepted"}
            for run_id in ("r1", "r2"):
                stages = [e.body.stage_id for e in ledger.history(run_id) if e.type == "StageReserved"]  # type: ignore[attr-defined]
                assert stages == [f"s-{i}" for i in range(40)]

    run(scenario())


def test_the_events_stream_equals_the_store_and_resumes_after_a_restart_without_duplicates(
    bus_store_url: str, nats_url: str
) -> None:
    """Given committed events, when the relay runs, stops and restarts, then the stream holds the log exactly once."""

    async def scenario() -> None:
        async with client(nats_url) as nc:
            async with serving(bus_store_url, nats_url) as (_, ledger):
                for run_id in ("r1", "r2", "r3"):
                    for item in (open_run(run_id), acquire(run_id, "w")):
                        verdict = await request(nc, item)
                        assert verdict.verdict == "accepted", verdict
            ledger = open_ledger(bus_store_url)  # appends while no relay runs
            try:
                for i in range(5):
                    verdict = ledger.submit(stage("r2", "w", 1, f"s-{i}"))
                    assert verdict.verdict == "accepted", verdict
            finally:
                ledger.close()
            async with serving(bus_store_url, nats_url) as (_, ledger):
                expected = [event for _, event in ledger.all_events()]

                async def caught_up() -> bool:
                    return len(await stream_events(nc)) >= len(expected)

                await eventually(caught_up, what="the relay to catch up")
                streamed = await stream_events(nc)
                assert [event for _, event in streamed] == expected  # same events, same order, no duplicate
                for headers, event in streamed:
                    assert headers["Nats-Msg-Id"] == f"{event.run_id}:{event.position}"
                for run_id in ("r1", "r2", "r3"):
                    assert [e for _, e in await stream_events(nc, run_id)] == list(ledger.history(run_id))

    run(scenario())


def test_partitioned_services_each_answer_every_request_of_their_runs(bus_store_url: str) -> None:
    """Given runs mapped onto 4 partitions and two services owning two each, then each run has one service."""
    answered: dict[str, set[str]] = {"A": set(), "B": set()}

    Checked = Submission | Verdict

    def recording(bus: NatsBus, name: str) -> None:
        check = bus.service.check

        def spy(raw: bytes, run_id: str | None = None, headers: Mapping[str, str] | None = None) -> Checked:
            answered[name].add(str(run_id))
            return check(raw, run_id, headers)

        bus.service.check = spy  # type: ignore[method-assign]

    async def scenario(url: str) -> None:
        async with (
            serving(bus_store_url, url, NatsOptions(partitions=(0, 1))) as (bus_a, ledger),
            serving(bus_store_url, url, NatsOptions(partitions=(2, 3), relay=False)) as (bus_b, _),
            client(url) as nc,
        ):
            recording(bus_a, "A")
            recording(bus_b, "B")
            runs = [f"run-{i}" for i in range(8)]
            for run_id in runs:
                await request(nc, open_run(run_id))
                await request(nc, acquire(run_id, "w"))
            verdicts = await asyncio.gather(
                *(request(nc, stage(run_id, "w", 1, f"s-{n}")) for n in range(3) for run_id in runs)
            )
            assert {v.verdict for v in verdicts} == {"accepted"}
            assert answered["A"] and answered["B"]  # both partitions' owners served
            assert not answered["A"] & answered["B"]  # and never the same run
            assert answered["A"] | answered["B"] == set(runs)
            assert all(ledger.verify(run_id).events == 5 for run_id in runs)

    with LocalNats(mappings=partition_mapping(4)) as server:
        run(scenario(server.url))


def test_the_service_verifies_signatures_as_the_ledger_does(postgres_url: str, nats_url: str) -> None:
    """Given a signed store served on the bus, when a signed submission and a forged one arrive, then
    the first is accepted and the forged one (another's key) refused, with nothing stored for it."""
    operator, alice, bob = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    init_store(postgres_url, operator_key=operator)
    for name, key in (("alice", alice), ("bob", bob)):
        assert register(postgres_url, operator, AddPrincipal(name, ("worker",), key.public_key)).verdict == "accepted"
    opening = Submission("s-1", "r1", "alice", OpenRun("rel-1", "agent", 1, BlobRef("sha256:" + "ab" * 32, 11)))

    async def scenario() -> None:
        async with serving(postgres_url, nats_url) as (_, ledger), client(nats_url) as nc:
            forged = await request(nc, msgspec.structs.replace(bob.sign(opening), worker="alice"))
            assert (forged.verdict, forged.reason) == ("rejected", "principal_mismatch")
            assert event_count(ledger, "r1") == 0
            signed = await request(nc, alice.sign(opening))
            assert signed.verdict == "accepted", signed

    run(scenario())
