"""``baton keys`` and ``baton principals``: the keys principals sign with, and the registry that names them."""

from __future__ import annotations

import contextlib

import click

from baton.adapters.bootstrap import open_ledger, register
from baton.adapters.cli.app import Failed
from baton.adapters.cli.options import echo_json, json_option, store_option
from baton.adapters.identity import SigningKey
from baton.domain.commands import AddPrincipal, Command, RevokePrincipal
from baton.domain.events import ROLES
from baton.domain.identity import REGISTRY_RUN

__all__ = ["COMMANDS", "read_key"]

key_option = click.option(
    "--key", "key_file", metavar="FILE", required=True, help="the private key file to sign with (an operator's)"
)


def read_key(path: str) -> SigningKey:
    """The key in ``path``, or a one-line failure naming the file."""
    if not path:
        raise Failed("a key file is needed: --key FILE")
    try:
        return SigningKey.read(path)
    except Exception as exc:
        raise Failed(str(exc)) from None


@click.group("keys")
def keys() -> None:
    """Ed25519 keys for principals."""


@keys.command("new")
@click.option("--out", "out", metavar="FILE", required=True, help="where to write the private key (mode 0600)")
def new(out: str) -> int:
    """Write a new private key to FILE and print its public key (ed25519:<base64>)."""
    key = SigningKey.generate()
    try:
        key.write(out)
    except FileExistsError:
        raise Failed(f"{out} exists: a key file is never overwritten") from None
    except OSError as exc:
        raise Failed(f"cannot write {out}: {exc.strerror}") from None
    click.echo(key.public_key)
    return 0


@click.group("principals")
def principals() -> None:
    """The store's principal registry: who may sign, with which roles."""


@principals.command("add")
@click.argument("name")
@click.option("--role", "roles", multiple=True, required=True, type=click.Choice(ROLES), help="a role (repeat)")
@click.option("--public-key", required=True, metavar="PUB", help="the principal's key: ed25519:<base64>")
@key_option
@store_option
def add(name: str, roles: tuple[str, ...], public_key: str, key_file: str, store: str | None) -> int:
    """Register NAME with its roles and public key (signed by an operator's key)."""
    return _submit(store, key_file, AddPrincipal(name, roles, public_key))  # type: ignore[arg-type]  # click checked


@principals.command("revoke")
@click.argument("name")
@key_option
@store_option
def revoke(name: str, key_file: str, store: str | None) -> int:
    """Revoke NAME: its earlier events stay valid; nothing new is accepted from it."""
    return _submit(store, key_file, RevokePrincipal(name))


@principals.command("list")
@json_option
@store_option
def listing(as_json: bool, store: str | None) -> int:
    """The registry's principals (name, roles, public key, revoked)."""
    with contextlib.closing(open_ledger(store, one_shot=True)) as ledger:
        registry = ledger.state(REGISTRY_RUN)
    found = sorted(registry.principals.values(), key=lambda p: p.name)
    if as_json:
        echo_json([{"name": p.name, "roles": p.roles, "public_key": p.public_key, "revoked": p.revoked} for p in found])
        return 0
    if not registry.signatures_required:
        click.echo("identities not verified: this store accepts unsigned submissions")
    for p in found:
        click.echo(f"{p.name}  {','.join(p.roles)}  {p.public_key}{'  (revoked)' if p.revoked else ''}")
    return 0


def _submit(store: str | None, key_file: str, command: Command) -> int:
    verdict = register(store, read_key(key_file), command)
    echo_json(verdict)
    return 0 if verdict.verdict != "rejected" else 1


COMMANDS = (keys, principals)
