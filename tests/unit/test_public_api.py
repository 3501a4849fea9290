"""``import baton`` is the public face: every name it exports resolves, and the domain stays light."""

from __future__ import annotations

import subprocess
import sys

import baton


def test_every_exported_name_resolves() -> None:
    """Given ``baton.__all__``, when each name is looked up, then it is the object of its home module."""
    for name in baton.__all__:
        assert getattr(baton, name) is not None, name
    assert baton.errors.StaleEpoch.reason == "stale_epoch"
    assert issubclass(baton.Rejection, baton.BatonError)


def test_importing_the_domain_loads_no_io_library() -> None:
    """Given a fresh interpreter, when ``baton.domain`` and ``baton.projections`` are imported, then no
    store, bus or settings library is loaded (``import baton`` resolves its names on first use)."""
    code = (
        "import sys, baton.domain, baton.projections; "
        "print(sorted(m for m in ('eventsourcing', 'psycopg', 'faststream', 'nats', 'pydantic') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout

    assert loaded.strip() == "[]"
