"""The frames ``nats_frames`` builds are byte for byte the ones nats-py's own ``publish`` writes."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client as NatsClient

from baton.adapters.bus.nats_app import _EVENT_HEADERS, _JetStreamSink, events_subject
from baton.adapters.bus.nats_frames import hpub, hpub_block, plain, pub
from baton.adapters.bus.relay import encode_event
from baton.domain.events import LeaseReleased, RecordedEvent

HEADERS = {
    "Nats-Msg-Id": "run-1:7",
    "Nats-Expected-Last-Sequence": "41",
    "Baton-Notification-Id": "458752",
    "Baton-Run-Id": "run-1",
    "Baton-Position": "7",
}


def written_by_publish(subject: str, payload: bytes, headers: dict[str, str] | None = None) -> bytes:
    """What an unconnected nats-py client queues for ``publish`` (its send path, without a socket)."""
    nc = NatsClient()
    sent: list[bytes] = []

    async def send(cmd: bytes, priority: bool = False) -> None:
        sent.append(cmd)

    nc._send_command = send  # type: ignore[method-assign]
    asyncio.run(nc._send_publish(subject, "", payload, len(payload), headers))
    assert len(sent) == 1
    return sent[0]


def test_a_pub_frame_equals_what_publish_writes() -> None:
    """Given a reply subject and a verdict, then the PUB frame is the one ``publish`` would queue."""
    payload = b'{"submission_id":"s-1","verdict":"accepted","run_id":"run-1","position":3}'
    assert pub("_INBOX.abc.123", payload) == written_by_publish("_INBOX.abc.123", payload)


def test_an_hpub_frame_equals_what_publish_writes_with_the_same_headers_in_order() -> None:
    """Given the relay's five headers, then the HPUB frame is the one ``publish`` would queue."""
    payload = '{"run_id":"run-1","position":7,"body":{"note":"é"}}'.encode()
    assert hpub("baton.events.run-1", HEADERS, payload) == written_by_publish("baton.events.run-1", payload, HEADERS)


def test_an_empty_payload_frames_the_same_too() -> None:
    """Given an empty payload, then both frames still match ``publish``'s."""
    assert pub("a.b", b"") == written_by_publish("a.b", b"")
    assert hpub("a.b", HEADERS, b"") == written_by_publish("a.b", b"", HEADERS)


def test_only_tokens_without_whitespace_are_plain() -> None:
    """Given tokens nats-py would refuse in a subject or change in a header value, then they are not plain."""
    assert plain("run-1") and plain("r:1/ä")
    assert not any(plain(token) for token in ("", "a b", "a\tb", "a\r\nPUB x 1", " a", "a\u2003"))


def test_the_relays_header_template_frames_what_publish_writes_with_its_headers() -> None:
    """Given a relayed event, then the frame from the relay's header template equals ``publish``'s with its headers."""
    sink = _JetStreamSink(bus=None)  # type: ignore[arg-type]
    sink._last_seq = 41
    event = RecordedEvent("run-1", 7, 2, "w", "s-7", 1_700_000_000_000_000, "sha256:" + "0" * 64, LeaseReleased("w", 2))
    payload, subject = encode_event(event), events_subject(event.run_id)
    run = event.run_id.encode()
    block = _EVENT_HEADERS % (run, event.position, sink._last_seq + 3, 458752, run, event.position)
    expected = written_by_publish(subject, payload, sink._headers(3, 458752, event))
    assert hpub_block(subject, block, payload) == expected
    assert hpub(subject, sink._headers(3, 458752, event), payload) == expected
