"""Options several commands share, each declared and decoded one way."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click
import msgspec

from baton.domain.events import Placement

__all__ = ["echo_json", "json_option", "no_events", "placement_options", "store_option"]

Command = Callable[..., int]

_json = msgspec.json.Encoder()

store_option = click.option("--store", metavar="URL", help="store URL (default: $BATON_STORE or sqlite:///baton.db)")
json_option = click.option("--json", "as_json", is_flag=True, help="print JSON")

_PLACEMENT = (
    click.option("--model", help="the model the target worker runs"),
    click.option("--provider", help="the target's model provider"),
    click.option("--region", help="the target's region"),
    click.option("--capability", multiple=True, help="a capability the target has (repeat)"),
    click.option("--tool-contract", multiple=True, help="name@version the target honours (repeat)"),
)


def placement_options(worker: str) -> Callable[[Command], Command]:
    """``--model --provider --region --capability --tool-contract``: where a worker runs, what it honours.

    The command receives them, with its parameter named ``worker``, as one ``placement``.
    """

    def decorate(command: Command) -> Command:
        @functools.wraps(command)
        def with_placement(**kwargs: Any) -> int:
            kwargs["placement"] = Placement(
                kwargs.pop(worker),
                model=kwargs.pop("model") or "",
                provider=kwargs.pop("provider") or "",
                region=kwargs.pop("region") or "",
                capabilities=tuple(kwargs.pop("capability")),
                tool_contracts=tuple(kwargs.pop("tool_contract")),
            )
            return command(**kwargs)

        for option in reversed(_PLACEMENT):
            with_placement = option(with_placement)
        return with_placement

    return decorate


def echo_json(value: Any) -> None:
    """One JSON document on one line of stdout."""
    click.echo(_json.encode(value).decode())


def no_events(run_id: str) -> int:
    click.echo(f"no events for run {run_id!r}", err=True)
    return 1
