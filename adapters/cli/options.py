"""Options several commands share, each declared and decoded one way."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click
import msgspec

from baton.domain.budgets import COUNTERS, Ceilings, Usage
from baton.domain.events import Placement

__all__ = [
    "echo_json",
    "json_option",
    "placement_options",
    "placement_text",
    "plain_text",
    "store_option",
    "usage_text",
]

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


def usage_text(usage: Usage, ceilings: Ceilings | None = None) -> str:
    """``calls 2/10, argument_bytes 149``: the counters in use, each over its ceiling when it has one."""
    parts = []
    for name in COUNTERS:
        used, ceiling = getattr(usage, name), getattr(ceilings, name, None)
        if used or ceiling is not None:
            parts.append(f"{name} {used}/{ceiling}" if ceiling is not None else f"{name} {used}")
    return ", ".join(parts) or "nothing used, no ceilings"


def placement_text(placement: Placement) -> str:
    """``worker-b (model m, provider p, region r; tools git@2, pytest@8)``."""
    runs = ", ".join(
        f"{label} {value}"
        for label, value in (("model", placement.model), ("provider", placement.provider), ("region", placement.region))
        if value
    )
    where = [runs] if runs else []
    if placement.capabilities:
        where.append("capabilities " + ", ".join(placement.capabilities))
    if placement.tool_contracts:
        where.append("tools " + ", ".join(placement.tool_contracts))
    return f"{placement.worker} ({'; '.join(where)})" if where else placement.worker


def plain_text(value: Any) -> str:
    """Any other value for a text line: ``-`` for nothing, references and lists as plain words, no reprs."""
    if value is None or value in ((), []):
        return "-"
    if isinstance(value, list | tuple):
        return ", ".join(plain_text(item) for item in value)
    if isinstance(value, dict):
        return ", ".join(f"{key} {plain_text(item)}" for key, item in value.items())
    if isinstance(value, msgspec.Struct):
        return plain_text(msgspec.to_builtins(value))
    return str(value)
