"""The top-level ``baton`` group and the one table from error to exit code.

A command returns its own outcome as an exit code (0, or 1 for "no", such as a denied gate or an
audit that found problems); a command that could not do its job raises ``Failed``; anything from
the ledger is mapped by ``EXIT_CODES``. Usage errors are click's and exit 2.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import IO, Any

import click
from eventsourcing.persistence import PersistenceError
from pydantic import ValidationError

from baton.domain.errors import BatonError, ChainBroken, StoreUnavailable

__all__ = ["EXIT_CODES", "Failed", "could_not", "root"]

# One table from error to exit code; any other exception is a bug and ends in a traceback.
EXIT_CODES: dict[type[BaseException], int] = {
    ChainBroken: 4,
    StoreUnavailable: 3,
    BatonError: 1,
    ValidationError: 2,
    PersistenceError: 3,
}


class Failed(click.ClickException):
    """The command could not do its job: ``baton: MESSAGE`` on stderr, exit 2 unless told otherwise."""

    exit_code = 2

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code  # click declares ``exit_code`` per class; this one is per failure

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"baton: {self.format_message()}", err=True, file=file)


@contextlib.contextmanager
def could_not(what: str, errors: tuple[type[BaseException], ...]) -> Iterator[None]:
    """The auditor's commands promise 0 clean, 1 problems found, 2 could not run: these errors are 2."""
    try:
        yield
    except errors as exc:
        raise Failed(f"{what} failed: {exc}") from None


class _Baton(click.Group):
    """Maps the ledger's errors to exit codes around whichever command runs."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except tuple(EXIT_CODES) as exc:
            code = next(code for kind, code in EXIT_CODES.items() if isinstance(exc, kind))
            raise Failed(_explain(exc), code) from None
        except BrokenPipeError:  # the reader went away (``baton history R | head``): not an error
            return 0


def _explain(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, PersistenceError) and ("does not exist" in str(exc) or "no such table" in str(exc)):
        return f"the store is not initialised ({text}); run: baton store init --store URL"
    return text


@click.group(cls=_Baton, context_settings={"help_option_names": ["-h", "--help"]})
def root() -> None:
    """Baton: the run ledger for movable AI agents.

    Every command that reads or writes a store takes --store URL (or BATON_STORE); the default is
    the SQLite file baton.db in the current directory.
    """
