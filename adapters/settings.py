"""Where the ledger lives: one store URL, validated at the edge and turned into library settings.

``sqlite:///rel/file.db`` is relative to the current directory and ``sqlite:////abs/file.db``
absolute (SQLAlchemy's convention: the path is what follows the third slash); the embedded default
is ``sqlite:///baton.db``. ``postgresql://user:password@host:port/dbname`` (``?host=/socket/dir``
for a unix socket). docs/operations.md, "Store URLs".

A URL that is not one of these is refused with ``BadSettings``, a sentence that names where it came
from (``--store`` or ``BATON_STORE``) and what to write instead; every message shows the URL without
its password (``display_url``).
"""

from __future__ import annotations

import os
import re
from typing import Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from pydantic import PrivateAttr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from baton.domain.errors import BatonError

__all__ = ["DEFAULT_STORE", "ONE_SHOT_WAIT_S", "BadSettings", "StoreSettings", "display_url"]

DEFAULT_STORE = "sqlite:///baton.db"
_RECORDERS = {
    "sqlite": "baton.adapters.eventstore.sqlite_recorder:FencedSQLiteRecorder",
    "postgresql": "baton.adapters.eventstore.postgres_recorder:FencedPostgresRecorder",
}
_POSTGRES = ("postgresql", "postgres")
_SQLITE_FORMS = "sqlite:///FILE (relative to the current directory) or sqlite:////ABSOLUTE/FILE (absolute)"
_FORMS = f"{_SQLITE_FORMS}, or postgresql://USER@HOST:PORT/DB"
# eventsourcing's POSTGRES_CONNECT_TIMEOUT is how long a caller waits for a connection from the pool
# (psycopg_pool's ``timeout``), not libpq's connect timeout. A long-running process keeps the
# library's 30 s: under load a request queues for a busy connection. A one-shot process is the pool's
# only user, so its wait is only ever for the connect itself: kept short, a dead store fails fast and
# is then diagnosed (``eventstore.reachability``).
LONG_RUNNING_WAIT_S = 30
ONE_SHOT_WAIT_S = 1
_IN_MEMORY = (":memory:", "file:")  # SQLite names that are not paths


class BadSettings(BatonError):
    """A setting Baton cannot use (a store URL that is not one): a usage error, not a store failure."""

    reason = "bad_settings"


class StoreSettings(BaseSettings):
    """The store URL: ``--store`` wins, then ``BATON_STORE`` (an empty one counts as unset), then the default."""

    model_config = SettingsConfigDict(env_prefix="BATON_", env_ignore_empty=True, frozen=True)

    store: str = DEFAULT_STORE
    _sqlite_path: str = PrivateAttr("")

    @classmethod
    def resolve(cls, url: str | None = None) -> StoreSettings:
        """The settings, or ``BadSettings`` naming the URL's source: pydantic's report is for developers."""
        try:
            return cls(store=url) if url else cls()
        except ValidationError as exc:
            error = exc.errors()[0]
            problem = error.get("ctx", {}).get("error") or error["msg"]
            source = "--store" if url else "BATON_STORE"
            raise BadSettings(f"{source} {display_url(str(error['input']))} {problem}") from None

    @property
    def url(self) -> str:
        return self.store

    @property
    def display_url(self) -> str:
        """The URL as messages show it: without its password."""
        return display_url(self.url)

    @field_validator("store")
    @classmethod
    def _store_url(cls, url: str) -> str:
        problem = _problem(url)
        if problem:
            raise ValueError(problem)
        return url

    @property
    def backend(self) -> Literal["sqlite", "postgresql"]:
        return "sqlite" if urlsplit(self.url).scheme == "sqlite" else "postgresql"

    def model_post_init(self, context: object, /) -> None:
        path = unquote(urlsplit(self.url).path)[1:]  # sqlite:///rel.db -> rel.db; sqlite:////a.db -> /a.db
        self._sqlite_path = path if path.startswith(_IN_MEMORY) else os.path.abspath(path)

    @property
    def sqlite_path(self) -> str:
        """The SQLite file, absolute: a relative URL is resolved against the current directory once,
        when the settings are made, so every message names the file really opened and a later
        ``chdir`` moves nothing."""
        return self._sqlite_path

    def postgres_params(self) -> dict[str, str]:
        """libpq's connection parameters, the ones eventsourcing's pool connects with (and only those)."""
        parts = urlsplit(self.url)
        query = dict(parse_qsl(parts.query))
        return {
            "dbname": unquote(parts.path.lstrip("/")) or "postgres",
            "host": query.get("host") or parts.hostname or "localhost",
            "port": str(parts.port or query.get("port") or 5432),
            "user": unquote(parts.username or query.get("user") or "postgres"),
            "password": unquote(parts.password or query.get("password") or ""),
        }

    def env(self, *, create_table: bool, one_shot: bool = False) -> dict[str, str]:
        """The eventsourcing environment for this store; ``one_shot`` for a process that opens the store
        once and exits (a CLI command): one connection, and a short wait for it."""
        env = {
            "ORIGINATOR_ID_TYPE": "text",
            "CREATE_TABLE": "y" if create_table else "n",
            "APPLICATION_RECORDER_TOPIC": _RECORDERS[self.backend],
        }
        if self.backend == "sqlite":
            return env | {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": self.sqlite_path}
        query = dict(parse_qsl(urlsplit(self.url).query))
        params = self.postgres_params()
        env |= {
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": params["dbname"],
            "POSTGRES_HOST": params["host"],
            "POSTGRES_PORT": params["port"],
            "POSTGRES_USER": params["user"],
            "POSTGRES_PASSWORD": params["password"],
            # one connection opened up front (a cold start connects once), grown on demand to eight
            "POSTGRES_POOL_SIZE": query.get("pool_size", "1"),
            "POSTGRES_MAX_OVERFLOW": query.get("max_overflow", "7"),
            "POSTGRES_CONNECT_TIMEOUT": str(LONG_RUNNING_WAIT_S),
        }
        if one_shot:  # a short-lived process gains nothing from a pool
            env |= {
                "POSTGRES_POOL_SIZE": "1",
                "POSTGRES_MAX_OVERFLOW": "1",
                "POSTGRES_CONNECT_TIMEOUT": str(ONE_SHOT_WAIT_S),
            }
        return env


def display_url(url: str) -> str:
    """``url`` without its password (in the user part or a ``password=`` parameter), for messages.

    Edited in place rather than rebuilt: ``urlunsplit`` would turn ``sqlite:///x.db`` into ``sqlite:/x.db``.
    """
    try:
        parts = urlsplit(url)
    except ValueError:  # unparsable: strip anything that looks like user:password@
        return re.sub(r"(//[^/@:]*):[^/]*@", r"\1@", url)
    shown = url
    if "@" in parts.netloc:
        user, host = parts.netloc.rsplit("@", 1)
        shown = shown.replace(f"//{parts.netloc}", f"//{user.split(':', 1)[0]}@{host}", 1)
    if "password=" in parts.query:
        kept = "&".join(p for p in parts.query.split("&") if not p.startswith("password="))
        shown = shown.replace(f"?{parts.query}", f"?{kept}" if kept else "", 1)
    return shown


def _problem(url: str) -> str:
    """What is wrong with ``url`` as a store URL, as the rest of a sentence ("" if nothing)."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        return f"is not a store URL ({exc}): use {_FORMS}"
    scheme = parts.scheme.lower()
    if len(scheme) <= 1:  # a bare path (or a Windows drive letter)
        relative = url if scheme == "" and not os.path.isabs(url) else os.path.basename(url)
        return (
            f"is not a store URL: use sqlite:///{os.path.abspath(url)} (absolute) or sqlite:///{relative} "
            "(relative to the current directory), or postgresql://USER@HOST:PORT/DB"
        )
    if scheme == "sqlite":
        return _sqlite_problem(parts.netloc, parts.path)
    if scheme in _POSTGRES:
        try:
            parts.port  # noqa: B018 - urlsplit checks the port only when asked
        except ValueError:
            return "has a port that is not a number: use postgresql://USER@HOST:PORT/DB"
        return ""
    return f"is not a store URL: Baton knows no {scheme}:// stores; use {_FORMS}"


def _sqlite_problem(netloc: str, path: str) -> str:
    if netloc:  # sqlite://dir/x.db: "dir" parsed as a host, and silently dropped before
        named = f"{netloc}{path}"
        return (
            f"names a host ({netloc}), which a SQLite store has none of: use sqlite:///{named} "
            f"(relative to the current directory) or sqlite:////{named} (absolute)"
        )
    if not path.lstrip("/"):
        return f"names no file: use {_SQLITE_FORMS}"
    if not path.startswith("/"):  # sqlite:x.db
        return (
            f"needs three slashes: use sqlite:///{path} (relative to the current directory) "
            f"or sqlite:////ABSOLUTE/{path} (absolute)"
        )
    return ""
