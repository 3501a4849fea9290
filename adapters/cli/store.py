"""``baton store init``: store administration."""

from __future__ import annotations

import click

from baton.adapters.bootstrap import init_store
from baton.adapters.cli.options import store_option

__all__ = ["COMMANDS"]


@click.group("store")
def store() -> None:
    """Store administration."""


@store.command("init")
@store_option
def init(store: str | None) -> int:
    """Create the schema once (idempotent)."""
    settings = init_store(store)
    click.echo(f"initialised {settings.backend} store {settings.url}")
    return 0


COMMANDS = (store,)
