"""The lease holder of the liveness tests: a worker in its own process, for the test to SIGKILL.

A plain module (not a conftest) so that a ``spawn`` child can import ``hold_lease`` by name.
"""

from __future__ import annotations

import time
from typing import Any

from baton.adapters.bootstrap import open_ledger
from baton.adapters.worker import LedgerTransport, Worker
from baton.domain.events import Placement

__all__ = ["HOLDER", "hold_lease"]

HOLDER = "holder-a"


def hold_lease(url: str, run_id: str, liveness: bool, report: Any) -> None:
    """Acquire ``run_id``'s lease as ``HOLDER`` (declaring this process's session if ``liveness``), report
    ``(epoch, session)`` on the pipe ``report``, then do nothing at all until killed."""
    ledger = open_ledger(url)
    worker = Worker(Placement(HOLDER), LedgerTransport(ledger), ledger, liveness=liveness)
    epoch = worker.acquire(run_id)
    report.send((epoch, ledger.state(run_id).lease.session))  # type: ignore[union-attr]  # just acquired
    time.sleep(3600)
