"""The destination worker of the generation-zero test: imports a handoff in its own process, for the
test to SIGKILL right after.

A plain module (not a conftest) so that a ``spawn`` child can import ``import_then_hang`` by name.
"""

from __future__ import annotations

import time
from typing import Any

from baton.adapters import handoff
from baton.adapters.bootstrap import open_ledger

__all__ = ["import_then_hang"]


def import_then_hang(url: str, document: bytes, digest: str, receipt: str, trust: str, report: Any) -> None:
    """Import ``document`` into the store at ``url`` (claim ``receipt``, trusting the source key ``trust``),
    report ``(verdict, position)`` on the pipe ``report``, then do nothing at all until killed."""
    ledger = open_ledger(url)
    verdict = handoff.accept(ledger, document, digest, receipt=receipt, trust=trust)
    report.send((verdict.verdict, verdict.position))
    time.sleep(3600)
