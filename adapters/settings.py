"""Where the ledger lives: one store URL, validated at the edge and turned into library settings.

``sqlite:///path/to/file.db`` (the embedded default is ``sqlite:///baton.db``) or
``postgresql://user:password@host:port/dbname`` (``?host=/socket/dir`` for a unix socket).
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import parse_qs, unquote, urlsplit

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["DEFAULT_STORE", "StoreSettings"]

DEFAULT_STORE = "sqlite:///baton.db"
_RECORDERS = {
    "sqlite": "baton.adapters.eventstore.sqlite_recorder:FencedSQLiteRecorder",
    "postgresql": "baton.adapters.eventstore.postgres_recorder:FencedPostgresRecorder",
}


class StoreSettings(BaseSettings):
    """The store URL: ``--store`` wins, then ``BATON_STORE`` (an empty one counts as unset), then the default."""

    model_config = SettingsConfigDict(env_prefix="BATON_", env_ignore_empty=True, frozen=True)

    store: str = DEFAULT_STORE

    @classmethod
    def resolve(cls, url: str | None = None) -> StoreSettings:
        return cls(store=url) if url else cls()

    @property
    def url(self) -> str:
        return self.store

    @field_validator("store")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        scheme = urlsplit(url).scheme
        if scheme not in ("sqlite", "postgresql", "postgres"):
            msg = f"unsupported store {url!r}: use sqlite:///FILE or postgresql://..."
            raise ValueError(msg)
        if scheme == "sqlite" and not urlsplit(url).path.lstrip("/"):
            msg = f"sqlite store needs a file: sqlite:///FILE, got {url!r}"
            raise ValueError(msg)
        return url

    @property
    def backend(self) -> Literal["sqlite", "postgresql"]:
        return "sqlite" if urlsplit(self.url).scheme == "sqlite" else "postgresql"

    def env(self, *, create_table: bool) -> dict[str, str]:
        """The eventsourcing environment for this store."""
        env = {
            "ORIGINATOR_ID_TYPE": "text",
            "CREATE_TABLE": "y" if create_table else "n",
            "APPLICATION_RECORDER_TOPIC": _RECORDERS[self.backend],
        }
        parts = urlsplit(self.url)
        if self.backend == "sqlite":
            path = unquote(parts.path)
            # sqlite:///rel.db -> "rel.db"; sqlite:////abs/path.db -> "/abs/path.db"
            env |= {"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": path[1:]}
            return env
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        env |= {
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": unquote(parts.path.lstrip("/")) or "postgres",
            "POSTGRES_HOST": query.get("host") or parts.hostname or "localhost",
            "POSTGRES_PORT": str(parts.port or query.get("port") or 5432),
            "POSTGRES_USER": unquote(parts.username or query.get("user") or "postgres"),
            "POSTGRES_PASSWORD": unquote(parts.password or query.get("password") or ""),
            # one connection opened up front (a cold start connects once), grown on demand to eight
            "POSTGRES_POOL_SIZE": query.get("pool_size", "1"),
            "POSTGRES_MAX_OVERFLOW": query.get("max_overflow", "7"),
        }
        return env
