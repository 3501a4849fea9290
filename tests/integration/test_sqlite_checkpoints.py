"""SQLite's WAL is copied back by a background thread, ahead of the checkpoints in appends' commits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from integration_support import LedgerFactory, Submitter, intent, open_run

from baton.adapters.eventstore.sqlite_checkpoints import WalCheckpointer

pytestmark = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)

RUN = "run-1"
APPENDS = 100  # about 400 WAL pages: under the 1000 at which a commit checkpoints by itself
ENVELOPE_BYTES = 800  # at least, for these intents


def test_the_thread_copies_appends_into_the_database_before_any_commit_would(
    ledgers: LedgerFactory, store_url: str
) -> None:
    """Given a ledger on a SQLite file, when a run takes 100 appends (too few WAL pages for SQLite to
    checkpoint in a commit), then the events reach the database file itself: the thread copied
    them there. Closing the ledger stops the thread."""
    path = store_url.removeprefix("sqlite:///")
    ledger = ledgers()
    assert open_run(ledger, RUN).verdict == "accepted"
    worker = Submitter(ledger, RUN, "A")
    assert worker.acquire(ttl_ms=600_000).verdict == "accepted"
    checkpointer = ledger.recorder._checkpointer  # type: ignore[attr-defined]
    assert isinstance(checkpointer, WalCheckpointer)
    size_before = os.path.getsize(path)

    for i in range(APPENDS):
        assert worker.submit(intent(f"op-{i}")).verdict == "accepted"

    def copied() -> bool:  # every page: the last checkpoint came after the last append
        return os.path.getsize(path) >= size_before + APPENDS * ENVELOPE_BYTES and checkpointer.checkpoints > 0

    deadline = time.monotonic() + 10
    while not copied() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.path.getsize(path) >= size_before + APPENDS * ENVELOPE_BYTES
    assert checkpointer.checkpoints > 0
    thread = checkpointer._thread
    assert thread is not None
    assert thread.is_alive()

    ledger.close()
    assert not thread.is_alive()


def test_a_reading_ledger_starts_no_thread(ledgers: LedgerFactory) -> None:
    """Given a ledger that only reads, then it starts no checkpoint thread (auditors stay single-threaded)."""
    ledger = ledgers()

    assert ledger.runs() == []
    assert ledger.recorder._checkpointer._thread is None  # type: ignore[attr-defined]


def test_a_process_that_never_closes_its_ledger_still_leaves_no_wal(store_url: str, tmp_path: Path) -> None:
    """Given a process that appends and exits without closing its ledger, then the database has no
    WAL file left: the thread is stopped at exit, so the last connection to close removes it."""
    path = store_url.removeprefix("sqlite:///")
    script = textwrap.dedent(
        f"""
        import time

        from baton.adapters.bootstrap import init_store, open_ledger
        from baton.domain.commands import OpenRun, Submission
        from baton.domain.events import BlobRef

        init_store({store_url!r})
        ledger = open_ledger({store_url!r})
        task = BlobRef("sha256:" + "ab" * 32, 1, "blob://task")
        verdict = ledger.submit(Submission("s-1", "run-1", "A", OpenRun("rel-1", "demo", 1, task)))
        assert verdict.verdict == "accepted", verdict
        time.sleep(0.3)  # the thread has checkpointed and waits for the next write
        """
    )

    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)

    assert done.returncode == 0, done.stderr
    assert os.path.exists(path)
    assert not os.path.exists(path + "-wal")
