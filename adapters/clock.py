"""Clocks in microseconds since the Unix epoch.

Lease expiry is judged by the store side's clock, injected here, never by a worker's own clock;
the manual clock makes expiry deterministic in the demo and in tests.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    def now(self) -> int: ...


class SystemClock:
    def now(self) -> int:
        return time.time_ns() // 1000


class ManualClock:
    """A clock that moves only when told to; it never goes backwards."""

    def __init__(self, start: int = 1_767_225_600_000_000) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> int:
        return self._now

    def advance(self, *, ms: int = 0, seconds: int = 0) -> int:
        if ms < 0 or seconds < 0:
            raise ValueError("a clock never goes backwards")
        with self._lock:
            self._now += ms * 1000 + seconds * 1_000_000
            return self._now
