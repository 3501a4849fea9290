"""Frames written with ``nats_frames`` on a real ``nats-server -js``: stored exactly as ``publish`` stores them."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js import api as js_api

from baton.adapters.bus.nats_frames import hpub, pub, writable, write

pytestmark = pytest.mark.timeout(60)


def headers(run_id: str, position: int, expected_last: int) -> dict[str, str]:
    return {
        "Nats-Msg-Id": f"{run_id}:{position}",
        "Nats-Expected-Last-Sequence": str(expected_last),
        "Baton-Notification-Id": str(position << 16),
        "Baton-Run-Id": run_id,
        "Baton-Position": str(position),
    }


async def stored(js: Any, stream: str, count: int) -> list[tuple[str, dict[str, str], bytes]]:
    """The stream's messages once it holds ``count`` (a stream stores asynchronously to the PONG of a
    flush), or whatever it holds after 10 s."""
    deadline = asyncio.get_running_loop().time() + 10
    info = await js.stream_info(stream)
    while info.state.last_seq < count and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)
        info = await js.stream_info(stream)
    found = []
    for seq in range(1, info.state.last_seq + 1):
        msg = await js.get_msg(stream, seq=seq)
        found.append((msg.subject, dict(msg.headers or {}), msg.data or b""))
    return found


async def with_streams(nats_url: str, body: Any) -> None:
    """Two empty streams, ``A`` on ``fa.>`` and ``B`` on ``fb.>``, removed afterwards."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        for name in ("FRAMES_A", "FRAMES_B"):
            await js.add_stream(name=name, subjects=[f"{name[-1].lower()}x.>"], storage=js_api.StorageType.FILE)
        await body(nc, js)
    finally:
        for name in ("FRAMES_A", "FRAMES_B"):
            await js.delete_stream(name)
        await nc.close()


def test_events_written_as_frames_are_stored_like_published_ones(nats_url: str) -> None:
    """Given the same page published by ``publish`` and written as one frame batch, then both streams hold the same."""
    payloads = [b'{"n":%d,"text":"\xc3\xa9"}' % i for i in range(5)]

    async def body(nc: NatsClient, js: Any) -> None:
        for i, payload in enumerate(payloads):
            await nc.publish("ax.run-1", payload, headers=headers("run-1", i + 1, i))
        assert writable(nc)
        await write(nc, [hpub("bx.run-1", headers("run-1", i + 1, i), p) for i, p in enumerate(payloads)], 0)
        await nc.flush()
        a, b = await stored(js, "FRAMES_A", len(payloads)), await stored(js, "FRAMES_B", len(payloads))
        assert len(a) == len(payloads)
        assert [(h, d) for _, h, d in a] == [(h, d) for _, h, d in b]
        assert {s for s, _, _ in b} == {"bx.run-1"}

    asyncio.run(with_streams(nats_url, body))


def test_a_frame_behind_the_stream_is_refused_like_a_published_one(nats_url: str) -> None:
    """Given a stream of two messages, when a frame expects last sequence 1, then the server does not store it."""

    async def body(nc: NatsClient, js: Any) -> None:
        await write(nc, [hpub("bx.r", headers("r", i + 1, i), b"x") for i in range(2)], 2)
        await write(nc, [hpub("bx.r", headers("r", 9, 1), b"late")], 4)
        ack = await js.publish("bx.r", b"last", headers=headers("r", 3, 2))  # still in order after the refusal
        assert ack.seq == 3
        assert [d for _, _, d in await stored(js, "FRAMES_B", 3)] == [b"x", b"x", b"last"]

    asyncio.run(with_streams(nats_url, body))


def test_replies_written_as_frames_reach_their_requesters(nats_url: str) -> None:
    """Given three requests waiting, when their replies go out as one frame batch, then each gets its own."""

    async def body(nc: NatsClient, js: Any) -> None:
        pending: list[Any] = []

        async def hold(msg: Any) -> None:
            pending.append(msg)
            if len(pending) == 3:
                await write(nc, [pub(m.reply, b"re:" + m.data) for m in pending], 0)

        await nc.subscribe("frames.echo", cb=hold)
        async with await nats.connect(nc.connected_url.geturl()) as other:  # type: ignore[union-attr]
            replies = await asyncio.gather(*(other.request("frames.echo", b"%d" % i, timeout=5) for i in range(3)))
        assert [r.data for r in replies] == [b"re:0", b"re:1", b"re:2"]

    asyncio.run(with_streams(nats_url, body))
