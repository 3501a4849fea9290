"""``baton views catch-up|rebuild``: the materialised views for analysts (docs/analytics.md)."""

from __future__ import annotations

import contextlib
import sys
import threading

import click

from baton.adapters.bootstrap import open_views
from baton.adapters.cli.options import store_option
from baton.adapters.views import DEFAULT_BATCH, CatchUp, ProgressLine, ViewRunner

__all__ = ["COMMANDS"]

BATCH_SIZE = click.option(
    "--batch-size", type=click.IntRange(min=1), default=DEFAULT_BATCH, show_default=True, help="events per transaction"
)


@click.group("views")
def views() -> None:
    """Materialised views for analysts (docs/analytics.md)."""


@views.command("catch-up")
@BATCH_SIZE
@click.option("--follow", is_flag=True, help="keep polling for new events until Ctrl-C")
@click.option("--interval", type=float, default=1.0, show_default=True, help="seconds between polls with --follow")
@store_option
def catch_up(batch_size: int, follow: bool, interval: float, store: str | None) -> int:
    """Fold new events into the views, one transaction per batch."""
    with open_views(store, batch_size=batch_size) as runner:
        if not follow:
            _print_views(runner, "caught up", runner.catch_up())
            return 0
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how --follow ends
            runner.follow(threading.Event(), interval=interval)
    return 0


@views.command("rebuild")
@BATCH_SIZE
@store_option
def rebuild(batch_size: int, store: str | None) -> int:
    """Rebuild the views under new names, then swap them in atomically; progress on stderr."""
    with open_views(store, batch_size=batch_size) as runner:
        progress = ProgressLine(sys.stderr, label="rebuild", total=runner.total_events())
        try:
            done = runner.rebuild(progress=progress)
        finally:
            progress.close()
        _print_views(runner, "rebuilt", done)
    return 0


def _print_views(runner: ViewRunner, verb: str, done: CatchUp) -> None:
    click.echo(
        f"{verb}: {done.events} events in {done.batches} batches ({done.rate:,.0f} events/s), position {done.position}"
    )
    click.echo("  " + ", ".join(f"{table} {rows} rows" for table, rows in runner.counts().items()))


COMMANDS = (views,)
