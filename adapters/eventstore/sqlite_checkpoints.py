"""WAL checkpoints mostly off the append path: a thread copies the WAL back while appends go on.

SQLite checkpoints inside the commit that leaves the WAL at 1000 pages or more: every few hundred
single appends, or every fourth 1000-event batch, one append copies the whole WAL into the
database file and syncs it (25-30 ms on the machine of docs/benchmarks.md). A ``PASSIVE``
checkpoint from another connection neither waits for nor blocks readers and writers, so this
thread runs one at most every ``INTERVAL_S`` after a commit, while the appending thread goes on
deciding (the copy and the sync release the GIL). The checkpoint in the commit stays as SQLite has
it: it is what restarts the WAL at its first page (SQLite restarts only at the start of a write
that finds every page copied back, which a checkpoint racing steady appends rarely leaves), so
the WAL stays near 1000 pages and every connection to the file, ours or not, keeps the default.
That checkpoint now finds most pages copied already, and copies only the rest.

One thread per writing ledger; a ledger that only reads starts none. ``close`` stops it after a
last checkpoint, and so does interpreter exit for a ledger never closed (``atexit``): the thread's
connection must close for the last connection to the file to remove the WAL.
"""

from __future__ import annotations

import atexit
import sqlite3
import sys
import threading
import weakref

__all__ = ["INTERVAL_S", "WalCheckpointer"]

INTERVAL_S = 0.1  # at most this often: appends in between share one checkpoint
_BUSY_TIMEOUT_S = 0.01  # PASSIVE never waits for locks but for a moment on the WAL index


class WalCheckpointer:
    """Checkpoints one database file (``PASSIVE``) at most every ``INTERVAL_S`` after it was written to.

    ``written()`` is called after each commit and costs an ``Event.set`` when the flag is down; the thread sleeps while
    nothing is written. A checkpoint kept from running by another is tried again after the next
    interval; one that a reader on an older snapshot kept from copying every page waits for the
    next write (so a long read does not keep the thread busy).
    """

    def __init__(self, path: str, *, interval_s: float = INTERVAL_S) -> None:
        self._path = path
        self._interval_s = interval_s
        self._dirty = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()
        self.checkpoints = 0  # checkpoints that copied every page there was: for tests and curiosity

    def written(self) -> None:
        if self._thread is None:
            self._start()
        if not self._dirty.is_set():  # a plain read; ``set`` takes the event's lock and notifies every time
            self._dirty.set()  # a flag seen set is cleared only before a checkpoint, which copies this commit

    def _start(self) -> None:
        with self._guard:
            if self._thread is None and not self._stopping.is_set():
                self._thread = threading.Thread(target=self._run, name="baton-wal-checkpoint", daemon=True)
                self._thread.start()
                _LIVE.add(self)

    def close(self) -> None:
        """Stop the thread, after a last checkpoint of whatever was written before the call."""
        self._stopping.set()
        self._dirty.set()
        _LIVE.discard(self)
        thread = self._thread
        # not during finalisation (a daemon thread frozen there never ends), nor from the thread
        # itself (a garbage collection it runs can close the pool)
        if thread is not None and not sys.is_finalizing() and thread is not threading.current_thread():
            thread.join(timeout=30)

    def _run(self) -> None:
        try:
            connection = sqlite3.connect(
                self._path, uri=True, isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT_S
            )
        except sqlite3.Error:  # unopenable: appends still checkpoint in their commits, as by default
            return
        try:
            while True:
                if not self._stopping.is_set():  # once set, ``close`` has set ``_dirty`` too, or will
                    self._dirty.wait()
                stopping = self._stopping.wait(self._interval_s)  # gather the writes of the interval
                self._dirty.clear()
                if self._checkpoint_was_busy(connection) and not stopping:
                    self._dirty.set()  # another checkpoint was running: again after the next interval
                if stopping:
                    return
        finally:
            connection.close()

    def _checkpoint_was_busy(self, connection: sqlite3.Connection) -> bool:
        """One PASSIVE checkpoint; True if another connection's checkpoint kept it from running."""
        try:
            busy, pages, copied = connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error:  # a closing database: the checkpoints in the commits remain
            return False
        if not busy and copied == pages:
            self.checkpoints += 1
        return bool(busy)


_LIVE: weakref.WeakSet[WalCheckpointer] = weakref.WeakSet()


@atexit.register
def _close_live() -> None:
    """Stop the threads of ledgers never closed, so the files' last connections can remove their WALs."""
    for checkpointer in list(_LIVE):
        checkpointer.close()
