"""Many small NATS messages written at once: a batch's verdicts and a page of relayed events.

nats-py's ``publish`` checks the subject with a regular expression, checks and cleans every header
line, and awaits three coroutines per message: here about 4 us of CPU per verdict and 12-20 us per
relayed event (five headers). Built from a template and written with one call per batch, the same
bytes cost about 1 and 4 us (docs/benchmarks.md, Bus).

Writing them takes what nats-py 2.16 keeps private: ``_send_command`` and ``_flush_pending``
(``write``: queued for its flusher task, as ``publish`` queues), or its pending buffer and
transport (``write_now``: to the socket at once, as the flusher writes). ``writable`` says whether
they are there and the connection takes publishes. When it says no, or a message is one this
module cannot vouch for (whitespace in a subject token or a header value, a payload over the
server's limit), the caller uses ``publish``, which raises what it always did.
tests/unit/test_bus_nats_frames.py pins the frames to ``publish``'s own bytes, and
tests/integration/test_bus_nats_frames.py what a real nats-server does with them: run both after
upgrading nats-py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from nats.aio.transport import TcpTransport

__all__ = ["hpub", "hpub_block", "plain", "pub", "writable", "write", "write_now"]

# what ``write`` and ``write_now`` use of nats-py's client (2.16)
_PRIVATE = ("_send_command", "_flush_queue", "_flush_pending", "_pending", "_pending_data_size", "_transport")
# str.isspace characters: nats-py refuses them in subjects and strips them from header values
_PLAIN = re.compile(r"\S+")


def plain(token: str) -> bool:
    """Whether ``token`` may go into a subject or a header value as it is (no whitespace, not empty)."""
    return _PLAIN.fullmatch(token) is not None


def writable(nc: Any) -> bool:
    """Whether frames may be written to ``nc`` directly: connected, not draining its publishes."""
    return (
        nc.is_connected
        and not nc.is_draining_pubs
        and all(hasattr(nc, name) for name in _PRIVATE)
        and nc._flush_queue is not None
    )


def pub(subject: str, payload: bytes) -> bytes:
    """The ``PUB`` frame ``publish(subject, payload)`` writes (no reply subject)."""
    return b"PUB %b  %d\r\n%b\r\n" % (subject.encode(), len(payload), payload)


def hpub(subject: str, headers: Mapping[str, str], payload: bytes) -> bytes:
    """The ``HPUB`` frame ``publish(subject, payload, headers=headers)`` writes.

    The caller vouches for the headers: keys are header tokens, values ``plain``.
    """
    block = ("NATS/1.0\r\n" + "".join(f"{key}: {value}\r\n" for key, value in headers.items()) + "\r\n").encode()
    return hpub_block(subject, block, payload)


def hpub_block(subject: str, block: bytes, payload: bytes) -> bytes:
    """``hpub`` with the header block already built (``NATS/1.0``, a line per header, an empty line)."""
    size = len(block)
    return b"HPUB %b  %d %d\r\n%b%b\r\n" % (subject.encode(), size, size + len(payload), block, payload)


async def write(nc: Any, frames: Sequence[bytes], payload_bytes: int) -> None:
    """Queue ``frames`` on the connection in one piece and wake its flusher, as ``publish`` does per message."""
    stats = nc.stats
    stats["out_msgs"] += len(frames)
    stats["out_bytes"] += payload_bytes
    await nc._send_command(b"".join(frames))  # private: see the module docstring
    if nc._flush_queue.empty():  # what ``publish`` does next: kick the flusher unless it is due anyway
        await nc._flush_pending()


def write_now(nc: Any, frames: Sequence[bytes], payload_bytes: int) -> bool:
    """Hand ``frames`` to the socket now, after whatever the connection had queued: False, nothing done,
    unless ``nc`` is ``writable`` over TCP.

    What nats-py's flusher task does on its next turn (``writelines`` of everything queued, then an
    empty queue), without waiting for that turn. The asyncio transport sends at once or buffers; a
    later ``publish`` still drains it.
    """
    transport = getattr(nc, "_transport", None)
    if not isinstance(transport, TcpTransport) or not writable(nc):
        return False
    stats = nc.stats
    stats["out_msgs"] += len(frames)
    stats["out_bytes"] += payload_bytes
    queued = nc._pending
    queued.append(b"".join(frames))
    nc._pending = []
    nc._pending_data_size = 0
    transport.writelines(queued)  # type: ignore[no-untyped-call]
    return True
