"""``baton demo``: the scripted handover, worker A to worker B mid-flight (adapters/demo.py)."""

from __future__ import annotations

import click

from baton.adapters.cli.options import store_option
from baton.adapters.demo import run_demo

__all__ = ["COMMANDS"]


@click.command("demo")
@store_option
def demo(store: str | None) -> int:
    """Run the scripted handover demo.

    Initialises the store if needed, then prints the run's timeline and how to inspect it.
    """
    return run_demo(store, out=click.echo)


COMMANDS = (demo,)
