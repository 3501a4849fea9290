"""Starting and stopping a bus app, and what runs beside it: the same for NATS and Kafka."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from typing import Any, Self

from faststream import FastStream

from baton.adapters.bus.relay import EventRelay
from baton.adapters.bus.service import SubmissionService

__all__ = ["BusLifecycle", "settle_heap"]


def settle_heap() -> None:
    """Once per process: collect, then move every object alive into the collector's permanent generation.

    A full collection walks every tracked object, holding the GIL, so every submission in flight
    waits for it; the tens of thousands of objects that importing the bus, the store and the
    brokers leaves make it a latency spike of its own. Frozen, the startup heap is never walked
    again; what the service creates later is collected as usual. Once per process (not at all if
    the embedding application froze its heap itself), so a process that starts many buses (the
    tests) pays the collection once.
    """
    if gc.get_freeze_count():
        return
    gc.collect()
    gc.freeze()


class BusLifecycle:
    """The FastStream app in ``self.app``, the group-commit service and the event relay beside it.

    Subclasses build ``app``, ``service``, ``relay`` and ``options`` (with a ``relay`` flag) and
    register ``_after_startup`` / ``_on_shutdown`` as the app's hooks.
    """

    app: FastStream
    service: SubmissionService
    relay: EventRelay
    options: Any
    _relay_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.app.start()
        settle_heap()  # after the brokers connected: their clients are startup heap too

    async def stop(self) -> None:
        await self.app.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def _after_startup(self) -> None:
        await self.service.start()
        if self.options.relay:
            self._relay_task = asyncio.create_task(self.relay.run(), name="baton-event-relay")

    async def _on_shutdown(self) -> None:
        task, self._relay_task = self._relay_task, None
        if task is not None:
            self.relay.stop()
            done, _ = await asyncio.wait({task}, timeout=10)
            if not done:  # stuck in a publish: cancel it
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self._close_publishers()
        await self.service.stop()

    async def _close_publishers(self) -> None:
        """Close what the relay publishes through, when the bus keeps its own producer."""
