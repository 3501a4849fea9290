"""Versioned store schemas: an ordered list of migrations per backend, recorded in ``baton_migrations``.

A migration's position in its list is its version, as in langgraph-checkpoint-postgres. Migration 0
creates the version table; migration 1 is the schema of every store made before versions were
recorded (the "baseline"). ``baton store init`` applies, in one transaction, every migration the
store lacks and records each ``(v, name)``. A store without the version table but with the
baseline's tables is recognised as at version 1: its version table is created and versions 0 and 1
are recorded without running their statements again.

Opening a ledger never changes the schema: a store that lacks a migration (or was migrated by a
newer Baton) is refused at open time with ``SchemaNotReady``, naming the command to run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from baton.domain.errors import StoreUnavailable

__all__ = ["BASELINE", "VERSION_TABLE", "Migration", "SchemaNotReady", "baseline_versions", "plan", "require_current"]

VERSION_TABLE = "baton_migrations"
BASELINE = 1  # the version of a store made before the version table existed


class Migration(NamedTuple):
    version: int
    name: str
    statements: tuple[str, ...]
    # a row made when the migration runs, never written into its SQL (the store's key): one
    # parameterised statement, run after ``statements`` in the same transaction
    seed: Callable[[], tuple[str, tuple[Any, ...]]] | None = None


class SchemaNotReady(StoreUnavailable):
    """The store's schema is not the one this Baton writes: missing, older, or newer."""

    retryable = False


def plan(migrations: Sequence[Migration], recorded: int | None, *, baseline_present: bool) -> list[Migration]:
    """The migrations to apply to a store at version ``recorded`` (None: no version table).

    Versions must be 0, 1, 2... in order. A store with no version table and ``baseline_present``
    needs only the version table (migration 0) and what follows the baseline; versions up to the
    baseline are recorded, not run (see ``baseline_versions``).
    """
    if [m.version for m in migrations] != list(range(len(migrations))):
        raise ValueError("migrations must be numbered 0, 1, 2... in order")
    if recorded is not None and recorded >= len(migrations):
        raise _too_new(recorded, len(migrations) - 1)
    if recorded is None and baseline_present:
        return [migrations[0], *migrations[BASELINE + 1 :]]
    start = 0 if recorded is None else recorded + 1
    return list(migrations[start:])


def baseline_versions(migrations: Sequence[Migration]) -> list[Migration]:
    """The migrations an unversioned store with the baseline's tables has applied already."""
    return list(migrations[1 : BASELINE + 1])


def require_current(
    recorded: int | None, migrations: Sequence[Migration], *, baseline_present: bool, store: str
) -> None:
    """Raise ``SchemaNotReady`` unless the store is at the latest version (an unversioned baseline
    store counts as at ``BASELINE``); ``store`` names it in the message (never with a password)."""
    latest = len(migrations) - 1
    version = BASELINE if recorded is None and baseline_present else recorded
    if version == latest:
        return
    if version is None or version < 0:
        msg = f"{store} has no Baton schema: run `baton store init` on it first"
        raise SchemaNotReady(msg)
    if version > latest:
        raise _too_new(version, latest)
    msg = (
        f"{store} is at schema version {version}, this Baton needs {latest}: "
        "run `baton store init` on it (after stopping older Baton processes that write to it)"
    )
    raise SchemaNotReady(msg)


def _too_new(version: int, latest: int) -> SchemaNotReady:
    return SchemaNotReady(
        f"the store's schema version {version} is newer than this Baton knows ({latest}): upgrade Baton"
    )
