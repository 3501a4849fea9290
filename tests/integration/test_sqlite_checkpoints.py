"""SQLite's WAL is checkpointed by a background thread, not inside an append's commit."""

from __future__ import annotations

import os
import threading
import time

import pytest
from integration_support import LedgerFactory, Submitter, intent, open_run

from adapters.eventstore.sqlite_checkpoints import BACKSTOP_PAGES, WalCheckpointer

pytestmark = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)

RUN = "run-1"


def _checkpointer_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "baton-wal-checkpoint"]


def test_appends_leave_the_checkpoint_to_the_thread_and_close_stops_it(ledgers: LedgerFactory, store_url: str) -> None:
    """Given a ledger on a SQLite file, when a run takes 300 appends (fewer WAL pages than the
    backstop), then its connection would checkpoint only at the backstop, yet the events are in the
    database file itself: a background thread copied them there. Closing the ledger stops the thread."""
    path = store_url.removeprefix("sqlite:///")
    ledger = ledgers()
    assert open_run(ledger, RUN).verdict == "accepted"
    size_before = os.path.getsize(path)
    checkpointer = ledger.recorder._checkpointer  # type: ignore[attr-defined]
    assert isinstance(checkpointer, WalCheckpointer)
    worker = Submitter(ledger, RUN, "A")
    assert worker.acquire(ttl_ms=600_000).verdict == "accepted"

    for i in range(300):
        assert worker.submit(intent(f"op-{i}")).verdict == "accepted"

    with ledger.recorder.datastore.transaction(commit=False) as c:  # type: ignore[attr-defined]
        c.execute("PRAGMA wal_autocheckpoint")
        assert c.fetchone()[0] == BACKSTOP_PAGES
    deadline = time.monotonic() + 10
    while os.path.getsize(path) < size_before + 300 * 800 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.path.getsize(path) >= size_before + 300 * 800  # 300 envelopes of ~800 bytes
    assert checkpointer.checkpoints > 0
    assert len(_checkpointer_threads()) == 1

    ledger.close()
    assert _checkpointer_threads() == []


def test_a_reading_ledger_starts_no_thread(ledgers: LedgerFactory) -> None:
    """Given a ledger that only reads, then no checkpoint thread runs for it (auditors stay single-threaded)."""
    ledger = ledgers()

    assert ledger.runs() == []
    assert _checkpointer_threads() == []
