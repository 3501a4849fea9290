"""Arguments several commands share, parsed one way."""

from __future__ import annotations

import argparse

from baton.domain.events import Placement

__all__ = ["add_placement_arguments", "placement_from"]


def add_placement_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model --provider --region --capability --tool-contract``: where a worker runs, what it honours."""
    parser.add_argument("--model")
    parser.add_argument("--provider")
    parser.add_argument("--region")
    parser.add_argument("--capability", action="append")
    parser.add_argument("--tool-contract", action="append", help="name@version the target honours (repeat)")


def placement_from(args: argparse.Namespace, worker: str) -> Placement:
    return Placement(
        worker,
        model=args.model or "",
        provider=args.provider or "",
        region=args.region or "",
        capabilities=tuple(args.capability or ()),
        tool_contracts=tuple(args.tool_contract or ()),
    )
