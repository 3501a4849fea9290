"""Times as the ledger stores them (integer microseconds since the epoch, UTC) and as people read them."""

from __future__ import annotations

import datetime as dt

__all__ = ["utc_text"]


def utc_text(micros: int) -> str:
    """``2026-12-02T21:21:33.250001Z``: ISO-8601 UTC, exact to the stored microsecond (none shown when
    it is zero), for messages and text output."""
    moment = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)
    return moment.isoformat().replace("+00:00", "Z")
