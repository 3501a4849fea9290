"""The top-level ``baton`` group and the one table from outcome to exit code.

A command returns its own outcome as an exit code (``Exit.OK``, or ``Exit.NO`` for an answer of
"no", such as a denied gate or a rejected submission); a command that could not do its job raises
``Failed`` with the code that says why; anything from the ledger is mapped by ``EXIT_CODES``. The
table is printed by ``baton --help`` and copied in the README, so a script can rely on it.
"""

from __future__ import annotations

import enum
import os
import sys
from typing import IO, Any

import click
from eventsourcing.persistence import PersistenceError
from pydantic import ValidationError

from baton.adapters.settings import BadSettings
from baton.domain.errors import BatonError, BusUnavailable, ChainBroken, StoreUnavailable

__all__ = ["EXIT_CODES", "EXIT_TABLE", "Exit", "Failed", "bad_file", "root", "unknown_run"]


class Exit(enum.IntEnum):
    OK = 0
    NO = 1  # the answer is no: an unknown run, a rejected submission, a denied gate
    USAGE = 2  # a bad option, bad settings (a store URL), an unreadable input file
    UNAVAILABLE = 3  # the store or the bus cannot be reached, or the store is not initialised
    VERIFICATION = 4  # a chain, an export or an audit did not verify
    INTERRUPTED = 130  # Ctrl-C


EXIT_TABLE = (
    ("0", "done (a gate: allowed; an audit or verification: clean)"),
    ("1", "no: an unknown run (named in the message, no output file written), a rejected submission, a denied gate"),
    ("2", "usage: a bad option or argument, bad settings such as a store URL, an unreadable input file"),
    ("3", "unavailable: the store or the bus cannot be reached, or the store is not initialised"),
    ("4", "verification failed: verify, verify-export or audit found a problem"),
    ("130", "interrupted (Ctrl-C)"),
)

# From error to exit code, the first kind that matches wins; any other exception is a bug and ends
# in a traceback.
EXIT_CODES: dict[type[BaseException], int] = {
    ChainBroken: Exit.VERIFICATION,
    StoreUnavailable: Exit.UNAVAILABLE,
    BusUnavailable: Exit.UNAVAILABLE,
    PersistenceError: Exit.UNAVAILABLE,
    ValidationError: Exit.USAGE,
    BadSettings: Exit.USAGE,
    BatonError: Exit.NO,
}


class Failed(click.ClickException):
    """The command could not do its job: ``baton: MESSAGE`` on stderr, exit 2 unless told otherwise."""

    exit_code = Exit.USAGE

    def __init__(self, message: str, code: int = Exit.USAGE) -> None:
        super().__init__(message)
        self.code = code  # click declares ``exit_code`` per class; this one is per failure

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"baton: {self.format_message()}", err=True, file=file)


def unknown_run(run_id: str) -> Failed:
    """The one message and code for a run the store has never seen, whichever command asked."""
    return Failed(f"no run {run_id!r} in this store (baton runs lists them)", Exit.NO)


def bad_file(path: object, exc: BaseException) -> Failed:
    """An input file that cannot be read or decoded: a sentence naming it, not a traceback."""
    cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).strip().splitlines()[0]
    return Failed(f"cannot read {path}: {cause}", Exit.USAGE)


class _Baton(click.Group):
    """Maps the ledger's errors to exit codes around whichever command runs."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except tuple(EXIT_CODES) as exc:
            code = next(code for kind, code in EXIT_CODES.items() if isinstance(exc, kind))
            raise Failed(_explain(exc), code) from None
        except BrokenPipeError:  # the reader went away (``baton export R | head``): not an error
            _silence_stdout()
            return Exit.OK
        except OSError as exc:  # a file a command was told to read or write
            raise Failed(_file_error(exc)) from None


def _explain(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, PersistenceError) and ("does not exist" in str(exc) or "no such table" in str(exc)):
        return f"the store is not initialised ({text}); run: baton store init --store URL"
    return text


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush of what the closed pipe refused
    does not print a second BrokenPipeError (the recipe of Python's ``signal`` documentation)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _file_error(exc: OSError) -> str:
    where = f"{exc.filename}: " if exc.filename is not None else ""
    return f"{where}{exc.strerror or exc}"


def _epilog() -> str:
    rows = "\n".join(f"  {code:>3}  {meaning}" for code, meaning in EXIT_TABLE)
    return f"\b\nExit codes:\n{rows}"


@click.group(cls=_Baton, context_settings={"help_option_names": ["-h", "--help"]}, epilog=_epilog())
@click.version_option(package_name="baton-ledger", prog_name="baton", message="%(prog)s %(version)s")
def root() -> None:
    """Baton: the run ledger for movable AI agents.

    Every command that reads or writes a store takes --store URL (or BATON_STORE); the default is
    the SQLite file baton.db in the current directory.
    """
