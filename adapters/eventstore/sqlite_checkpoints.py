"""WAL checkpoints off the append path: a thread per writing process copies the WAL back into the database.

By default SQLite checkpoints inside the commit that takes the WAL past 1000 pages: every few
hundred single appends, or every fourth 1000-event batch, one append pays 25-30 ms here to copy
the WAL into the database file and sync it. SQLite's documentation names the alternative: turn the
automatic checkpoint off and checkpoint from another thread. This module is that thread. A
PASSIVE checkpoint neither waits for nor blocks readers and writers, so appends go on while it runs
on the other core (the copy and the sync release the GIL).

The automatic checkpoint stays on as a backstop at ``BACKSTOP_PAGES``: if the thread falls behind
(or is gone, as in a child forked from a writing process) the WAL still cannot grow without bound.
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
import threading

__all__ = ["BACKSTOP_PAGES", "INTERVAL_S", "WalCheckpointer"]

INTERVAL_S = 0.1  # at most this often: appends in between share one checkpoint
BACKSTOP_PAGES = 8000  # ~32 MiB of WAL: what one process appends in about two seconds flat out


class WalCheckpointer:
    """Checkpoints one database file at most every ``INTERVAL_S`` after it was written to.

    ``written()`` is called after each commit and costs an ``Event.set``; the thread sleeps
    while nothing is written. Several processes on one file each run one: a checkpoint that finds
    another running reports busy and is simply tried again after the next write.
    """

    def __init__(self, path: str, *, interval_s: float = INTERVAL_S) -> None:
        self._path = path
        self._interval_s = interval_s
        self._dirty = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()
        self.checkpoints = 0  # completed checkpoint calls: for tests and curiosity

    def written(self) -> None:
        if self._thread is None:
            self._start()
        self._dirty.set()

    def _start(self) -> None:
        with self._guard:
            if self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(target=self._run, name="baton-wal-checkpoint", daemon=True)
                self._thread.start()

    def close(self) -> None:
        """Stop the thread, after a last checkpoint of whatever was written before the call."""
        self._stopping.set()
        self._dirty.set()
        thread = self._thread
        # not at exit (a daemon thread frozen there never ends), nor from the thread itself (a
        # garbage collection it runs can close the pool)
        if thread is not None and not sys.is_finalizing() and thread is not threading.current_thread():
            thread.join(timeout=30)

    def _run(self) -> None:
        try:
            connection = sqlite3.connect(self._path, uri=True, isolation_level=None, check_same_thread=False)
        except sqlite3.Error:  # the file went away under a closing process: the backstop remains
            return
        try:
            while True:
                self._dirty.wait()
                stopping = self._stopping.wait(self._interval_s)  # gather the writes of the interval
                self._dirty.clear()
                with contextlib.suppress(sqlite3.Error):  # busy, or a closing database: the backstop remains
                    connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                    self.checkpoints += 1
                if stopping:
                    return
        finally:
            connection.close()
