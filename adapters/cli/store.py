"""``baton store init`` and ``baton store id``: store administration."""

from __future__ import annotations

import contextlib
from pathlib import Path

import click

from baton.adapters.bootstrap import init_store, open_ledger, store_identity
from baton.adapters.cli.app import Failed
from baton.adapters.cli.identity import read_key
from baton.adapters.cli.options import echo_json, json_option, store_option
from baton.adapters.identity import SigningKey
from baton.domain.identity import REGISTRY_RUN

__all__ = ["COMMANDS"]


@click.group("store")
def store() -> None:
    """Store administration."""


@store.command("init")
@store_option
@click.option("--operator-key", metavar="FILE", help="the first operator's private key (default: a new one)")
@click.option(
    "--key-out",
    metavar="FILE",
    default="baton-operator.key",
    show_default=True,
    help="where a new operator key is written (mode 0600)",
)
@click.option("--operator", default="operator", show_default=True, help="the first operator's name")
@click.option("--unsigned", is_flag=True, help="a development store: accept unsigned submissions")
def init(store: str | None, operator_key: str | None, key_out: str, operator: str, unsigned: bool) -> int:
    """Create or upgrade the schema (idempotent) and, on a new store, open its principal registry.

    A new store verifies identities: its first operator's key is --operator-key, or a new key
    written to --key-out. --unsigned makes a development store instead. A store that already has
    runs but no registry keeps accepting unsigned submissions until --operator-key is given.
    """
    if unsigned and operator_key:
        raise Failed("--unsigned and --operator-key contradict each other")
    init_store(store)  # the schema first: the registry lives in it
    with contextlib.closing(open_ledger(store, one_shot=True)) as ledger:
        registry, has_runs = ledger.state(REGISTRY_RUN), bool(ledger.runs())
    key: SigningKey | None = None
    written: Path | None = None
    if operator_key:
        key = read_key(operator_key)
    elif not unsigned and not registry.opened and not has_runs:
        key = SigningKey.generate()
        try:
            written = key.write(key_out)
        except FileExistsError:
            raise Failed(f"{key_out} exists: pass it as --operator-key, or choose another --key-out") from None
    settings = init_store(store, operator_key=key, operator=operator, unsigned=unsigned)
    click.echo(f"initialised {settings.backend} store {settings.url}")
    if written is not None:
        click.echo(f"operator {operator!r}: private key written to {written.resolve()} (keep it safe)")
    with contextlib.closing(open_ledger(store, one_shot=True)) as ledger:
        registry = ledger.state(REGISTRY_RUN)
    if registry.signatures_required:
        click.echo(f"identities verified: {len(registry.principals)} principal(s) in the registry")
    else:
        click.echo("identities not verified: this store accepts unsigned submissions")
    return 0


@store.command("id")
@store_option
@json_option
def store_id(store: str | None, as_json: bool) -> int:
    """The store's id and Ed25519 public key, made by `baton store init` (the private key is never shown)."""
    identity = store_identity(store)
    if as_json:
        echo_json({"store_id": identity.store_id, "public_key": identity.public_key})
    else:
        click.echo(f"store id    {identity.store_id}")
        click.echo(f"public key  {identity.public_key}")
    return 0


COMMANDS = (store,)
