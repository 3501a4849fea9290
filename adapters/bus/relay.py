"""Committed events to the bus, at least once, from the log: never dual-written in the submit path.

The relay tails ``ledger.all_events(after=position)`` in global (notification) order and hands
pages to a sink. The tracking position is kept by the sink itself, in the bus (the notification
id of the last event it holds), so a restarted or second relay resumes where the stream ends and
no extra table or transaction is needed. A sink that finds it is behind (another relay published
first) answers ``False`` and the relay resynchronises from the sink's position.

On a bus with no conditional append (Kafka) two relays would both publish, so the relay may be
given ``leader``: it publishes only while that says this process holds the store's relay lock,
checked again before every page, and otherwise stands by (docs/operations.md, "Event relay on Kafka").
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import Protocol

import msgspec

from baton.adapters.bus.service import Ledger
from baton.domain.events import RecordedEvent

__all__ = ["EVENT_HEADERS", "EventRelay", "EventSink", "encode_event", "event_message_id"]

log = logging.getLogger("baton.bus.relay")

EVENT_HEADERS = ("Baton-Notification-Id", "Baton-Run-Id", "Baton-Position")

_json = msgspec.json.Encoder()


def encode_event(event: RecordedEvent) -> bytes:
    """The event's envelope as JSON, the ``baton schema event`` schema."""
    return _json.encode(event)


def event_message_id(event: RecordedEvent) -> str:
    """Unique per event forever: run and store position (a consumer's dedupe key)."""
    return f"{event.run_id}:{event.position}"


class EventSink(Protocol):
    async def last_position(self) -> int:
        """The notification id of the last event the bus holds (0 when none)."""
        ...

    async def publish(self, events: list[tuple[int, RecordedEvent]], after: int) -> bool:
        """Publish in order after ``after``; False when the bus moved on without us (resync)."""
        ...


class EventRelay:
    def __init__(
        self,
        ledger: Ledger,
        sink: EventSink,
        *,
        wake: asyncio.Event | None = None,
        page: int = 256,
        poll: float = 0.2,
        linger: float = 0.05,
        leader: Callable[[], bool] | None = None,
        standby: float = 1.0,
    ) -> None:
        """``leader``: asked (in a thread) before the relay publishes a page; while it says False the
        relay stands by, asking again every ``standby`` seconds. None: always publish."""
        self.ledger = ledger
        self.sink = sink
        self.wake = wake or asyncio.Event()
        self.page = page
        self.poll = poll
        self.linger = linger
        self.leader = leader
        self.standby = standby
        self.leading = leader is None  # whether the last check found this process the relay
        self.position = 0
        self.published = 0
        self._stopped = False

    async def run(self) -> None:
        """Publish until ``stop``; transport or store errors are logged and retried after a pause."""
        while not self._stopped:
            try:
                if not await asyncio.get_running_loop().run_in_executor(None, self._lead):
                    await self._stand_by()
                    continue
                self.position = await self.sink.last_position()
                await self._follow()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("event relay failed; resynchronising in 1 s")
                await self._pause(1)

    def stop(self) -> None:
        """Ask ``run`` to return; a flag, because Python 3.11's ``wait_for`` can swallow a cancel."""
        self._stopped = True
        self.wake.set()

    async def _stand_by(self) -> None:
        """Sleep, not ``_pause``: local commits must not wake a relay that is not the one publishing."""
        deadline = asyncio.get_running_loop().time() + self.standby
        while not self._stopped and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(min(0.1, self.standby))

    def _lead(self) -> bool:
        if self.leader is not None:
            leading = self.leader()
            if leading != self.leading:
                log.info("event relay: %s", "publishing (holds the relay lock)" if leading else "standing by")
            self.leading = leading
        return self.leading

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.wake.wait()
        self.wake.clear()

    async def _follow(self) -> None:
        while not self._stopped:
            events = await asyncio.get_running_loop().run_in_executor(None, self._read, self.position)
            if events is None:
                return  # the relay lock is lost: stand by
            if events:
                if not await self.sink.publish(events, self.position):
                    return  # another relay got ahead: resynchronise from the bus
                self.position = events[-1][0]
                self.published += len(events)
                if len(events) == self.page:
                    continue  # behind: read the next page at once
            await self._pause(self.poll)  # until a local commit or the poll interval (commits elsewhere)
            # Let a burst of commits accumulate: one read per burst, not one per commit. Each page
            # costs a thread handoff, a query and an acknowledged publish, so fewer, fuller pages
            # leave the service more CPU for verdicts.
            await asyncio.sleep(self.linger)

    def _read(self, after: int) -> list[tuple[int, RecordedEvent]] | None:
        """The next page, or None when this process is no longer the relay (checked first, in the same
        thread call: the check is as close to the publish as a round trip allows)."""
        if not self._lead():
            return None
        events = self.ledger.all_events(after=after, page=self.page)
        try:
            return list(itertools.islice(events, self.page))
        finally:
            close = getattr(events, "close", None)  # a generator: release its cursor now
            if close is not None:
                close()
