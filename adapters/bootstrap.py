"""The composition root: the only place that turns settings into concrete adapters."""

from __future__ import annotations

from adapters.clock import Clock
from adapters.eventstore import RunLedger
from adapters.settings import StoreSettings

__all__ = ["init_store", "open_ledger"]


def open_ledger(url: str | None = None, *, clock: Clock | None = None) -> RunLedger:
    """A ledger on an initialised store; it never creates tables (``baton store init`` does)."""
    settings = StoreSettings.resolve(url)
    return RunLedger(settings.env(create_table=False), clock=clock)


def init_store(url: str | None = None) -> StoreSettings:
    """Create the schema once: tables, fence function, append-only triggers. Idempotent."""
    settings = StoreSettings.resolve(url)
    ledger = RunLedger(settings.env(create_table=True))
    ledger.close()
    return settings
