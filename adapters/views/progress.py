"""A one-line progress bar (carriage return, no dependency) with the rate in events per second."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["ProgressLine", "render"]

_WIDTH = 30


def render(label: str, done: int, total: int | None, seconds: float) -> str:
    """``label [#####-----]  50%  1,000/2,000 events  8,123 ev/s`` (no bar when the total is unknown)."""
    rate = f"{done / seconds:,.0f} ev/s" if seconds > 0 else "- ev/s"
    if not total:
        return f"{label} {done:,} events  {rate}"
    share = min(done / total, 1.0)
    filled = round(share * _WIDTH)
    bar = "#" * filled + "-" * (_WIDTH - filled)
    return f"{label} [{bar}] {share:4.0%}  {done:,}/{total:,} events  {rate}"


class ProgressLine:
    """Redraws at most every ``every`` seconds; ``close`` draws the final line and ends it."""

    def __init__(
        self,
        stream: TextIO,
        *,
        label: str,
        total: int | None,
        every: float = 0.1,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._stream, self._label, self._total, self._every, self._clock = stream, label, total, every, clock
        self._started = self._drawn = clock()
        self._done = 0

    def __call__(self, done: int) -> None:
        self._done = done
        now = self._clock()
        if now - self._drawn >= self._every:
            self._draw(now)

    def _draw(self, now: float) -> None:
        self._drawn = now
        self._stream.write("\r" + render(self._label, self._done, self._total, now - self._started))
        self._stream.flush()

    def close(self) -> None:
        self._draw(self._clock())
        self._stream.write("\n")
        self._stream.flush()
