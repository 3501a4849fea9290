"""Why a store cannot be opened, in one sentence that names it (without its password).

eventsourcing's pool hides the cause of a failed connect: it retries in the background and the
caller only learns "couldn't get a connection after N sec". So when the first use of a store fails,
one direct connection (``psycopg.connect`` with a short ``connect_timeout``) asks the server why:
refused, host not found, authentication failed, no such database, or no answer at all. A SQLite
file that cannot be opened is explained from its path (a missing directory, a directory in its place).

The diagnosis runs only on failure, so a command that opens a healthy store pays for no extra
connection; a long-running process calls ``check_reachable`` once up front instead (``bootstrap``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import psycopg
from eventsourcing.persistence import InterfaceError, OperationalError
from psycopg.conninfo import make_conninfo

from baton.adapters.settings import StoreSettings
from baton.domain.errors import StoreUnavailable

__all__ = ["DIAGNOSE_TIMEOUT_S", "StoreUnreachable", "check_reachable", "first_contact"]

T = TypeVar("T")

# psycopg's (and libpq's) smallest connect timeout; it comes after the pool's own wait, and the two
# together stay well under the 5 s a command may take to say that its store is gone
DIAGNOSE_TIMEOUT_S = 2
_FAILED_TO_OPEN = (OperationalError, InterfaceError)  # eventsourcing's, raised by the pool or sqlite3


class StoreUnreachable(StoreUnavailable):
    """The store cannot be opened at all (as opposed to failing while in use); the message says why."""


def first_contact(settings: StoreSettings, action: Callable[[], T]) -> T:
    """``action()``, the first thing done with a freshly built ledger; a failure to reach the store is
    raised as ``StoreUnreachable`` with its cause.

    If the server answers the direct connection, it was slow rather than gone (the pool's wait is
    short in a one-shot process): the action is tried once more before giving up.
    """
    try:
        return action()
    except _FAILED_TO_OPEN as exc:
        failure: Exception = exc
    if settings.backend == "sqlite":
        raise StoreUnreachable(sqlite_cause(settings.sqlite_path, settings.url, failure)) from None
    check_reachable(settings, timeout=DIAGNOSE_TIMEOUT_S)
    try:
        return action()
    except _FAILED_TO_OPEN as exc:
        raise StoreUnavailable(f"cannot use {settings.display_url}: {_first_line(exc)}") from None


def check_reachable(settings: StoreSettings, *, timeout: int) -> None:
    """Connect once, directly, with the parameters the pool uses; raise ``StoreUnreachable`` if that fails.

    SQLite has nothing to reach: a file's problems show when it is opened.
    """
    if settings.backend != "postgresql":
        return
    params = settings.postgres_params()
    try:
        psycopg.connect(make_conninfo(**params), connect_timeout=timeout).close()
    except psycopg.Error as exc:
        cause = postgres_cause(exc, params, timeout)
        raise StoreUnreachable(f"cannot connect to {settings.display_url}: {cause}") from None


def postgres_cause(exc: psycopg.Error, params: dict[str, str], timeout: int) -> str:
    """The reason a connect failed, from libpq's message (connection errors carry no SQLSTATE), with a
    hint at the fix; an unrecognised message (another language, another failure) is kept as it is."""
    text = str(exc).lower()
    host, port, user, dbname = params["host"], params["port"], params["user"], params["dbname"]
    socket = host.startswith("/")
    where = f"{host}/.s.PGSQL.{port}" if socket else f"{host}:{port}"
    listening = f"with its socket at {where}" if socket else f"listening on {where}"
    causes = (  # (does libpq's message say this, what Baton says), the first that matches
        (
            isinstance(exc, psycopg.errors.ConnectionTimeout) or "timeout expired" in text,
            f"timed out: no answer from {where} within {timeout} s (is the host up, or a firewall dropping packets?)",
        ),
        (
            "connection refused" in text or (socket and "no such file or directory" in text),
            f"connection refused (is PostgreSQL running and {listening}?)",
        ),
        (
            any(s in text for s in ("resolve host", "translate host name", "name or service not known", "nodename")),
            f"host {host} not found (check the host name)",
        ),
        (
            f'role "{user.lower()}" does not exist' in text,
            f"authentication failed: user {user} does not exist (check the user name)",
        ),
        (
            "no password supplied" in text,
            f"authentication failed: the server wants a password for user {user} and the URL gives none",
        ),
        ("authentication failed" in text, f"authentication failed for user {user} (check the user name and password)"),
        (
            f'database "{dbname.lower()}" does not exist' in text,
            f"database {dbname} does not exist (create it first: baton store init makes tables, not databases)",
        ),
    )
    return next((cause for matches, cause in causes if matches), _first_line(exc))


def sqlite_cause(path: str, url: str, exc: BaseException) -> str:
    """Why the SQLite file at ``path`` (absolute) cannot be opened, read from the file system."""
    directory = os.path.dirname(path)
    if not os.path.exists(directory):
        why = f"directory {directory} does not exist"
        if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
            absolute = "/" + url.removeprefix("sqlite:///")
            if os.path.isdir(os.path.dirname(absolute)):
                why += f"; sqlite:/// is relative to the current directory: for {absolute} write sqlite:///{absolute}"
    elif not os.path.isdir(directory):
        why = f"{directory} is not a directory"
    elif os.path.isdir(path):
        why = "it is a directory"
    elif not os.access(path if os.path.exists(path) else directory, os.R_OK | os.W_OK):
        why = "permission denied"
    else:
        why = _first_line(exc)
    return f"cannot open the SQLite store {path} ({why})"


def _first_line(exc: BaseException) -> str:
    """libpq's first line, without the "connection failed:" wrappers that only repeat what we say."""
    line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    for prefix in ("connection failed: ", "connection is bad: "):
        line = line.removeprefix(prefix)
    return line.replace("FATAL:  ", "")
