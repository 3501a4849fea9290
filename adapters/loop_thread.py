"""A private event loop in a daemon thread: how the worker's transports keep a synchronous API over
asyncio clients (nats-py, aiokafka) without touching the caller's own event loop, if it has one."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any

from baton.domain import errors

__all__ = ["LoopThread"]


class LoopThread:
    """Runs coroutines on its loop for the calling thread; after ``close`` every call is ``StoreUnavailable``."""

    def __init__(self, name: str, *, timeout: float) -> None:
        self.name, self.timeout = name, timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """``coro``'s result, waiting at most the transport's timeout plus a margin for its own timeouts."""
        if self._loop.is_closed():  # a background lease renewal after close
            coro.close()
            raise errors.StoreUnavailable(f"{self.name}: the transport is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self.timeout + 5)

    def close(self, last: Coroutine[Any, Any, Any] | None = None) -> None:
        """Run ``last`` (the client's goodbye; its failure does not matter now), then stop the loop."""
        if self._loop.is_closed():
            if last is not None:
                last.close()
            return
        if last is not None:
            with contextlib.suppress(Exception):  # closing what half started, or a server already gone
                self.run(last)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
