"""Integration fixtures: the same tests run against every store backend.

``store_url`` is parametrised over SQLite (a file in ``tmp_path``) and PostgreSQL (a fresh
database on the session's embedded server), in the spirit of eventsourcing's one contract test
body per recorder. The Postgres server is only started when a Postgres case actually runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from bus_fixtures import bus_store_url, nats_cluster, nats_server, nats_url, services, tansu_server
from integration_support import LedgerFactory, RawStore

from baton.adapters.bootstrap import init_store, open_ledger
from baton.adapters.clock import Clock, ManualClock
from baton.adapters.eventstore import RunLedger

__all__ = [
    "bus_store_url",
    "nats_cluster",
    "nats_server",
    "nats_url",
    "services",
    "tansu_server",
]  # the bus fixtures, registered here


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An uninitialised store URL for the backend named by the parameter."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'baton.db'}"  # tmp_path is absolute: sqlite:////...
        return
    yield request.getfixturevalue("postgres_url")  # a fresh database, dropped after the test


@pytest.fixture
def store(store_url: str) -> RawStore:
    """The store at ``store_url``, initialised, with raw SQL access for checks."""
    init_store(store_url)
    return RawStore(store_url, "sqlite" if store_url.startswith("sqlite:") else "postgres")


@pytest.fixture
def ledgers(store: RawStore) -> Iterator[LedgerFactory]:
    """Opens ledgers on ``store`` (each with its own clock and connections); closes them after."""
    opened: list[RunLedger] = []

    def factory(clock: Clock | None = None) -> RunLedger:
        ledger = open_ledger(store.url, clock=clock or ManualClock())
        opened.append(ledger)
        return ledger

    yield factory
    for ledger in opened:
        ledger.close()


@pytest.fixture
def stores(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict[str, RunLedger]]:
    """Three independent stores A (SQLite), B (PostgreSQL) and C (SQLite), each with its own ledger (the
    cross-store handoff tests)."""
    urls = {"A": f"sqlite:///{tmp_path / 'a.db'}", "B": request.getfixturevalue("postgres_url"), "C": ""}
    urls["C"] = f"sqlite:///{tmp_path / 'c.db'}"
    ledgers = {}
    for name, url in urls.items():
        init_store(url)
        ledgers[name] = open_ledger(url, clock=ManualClock())
    yield ledgers
    for ledger in ledgers.values():
        ledger.close()
