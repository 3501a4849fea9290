"""Registered, pure migrations of the task state between versions of its schema.

A migration step is a pure function ``fn(state) -> state`` registered for one schema name and one
version step (``from_version`` -> ``to_version``, forward only). ``migrate`` chains the steps from a
version to a later one and returns the new state with the ``Migration`` that the handoff document
records; it runs once, at handoff, and resume never re-runs it. A missing link is refused with
``MigrationMissing`` rather than guessed. Each step receives a deep copy, so even a step that
mutates its argument cannot change the caller's state.

Registration is explicit: ``REGISTRY`` holds only the example schema ``coding-agent`` below; tests
and applications build their own ``MigrationRegistry`` or register on this one deliberately.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, NamedTuple

from baton.domain.errors import MigrationMissing
from baton.domain.handoff_document import IDENTITY, Migration

__all__ = ["REGISTRY", "MigrationFn", "MigrationRegistry", "Step", "migrate", "register"]

MigrationFn = Callable[[dict[str, Any]], dict[str, Any]]
_CHAIN = "+"


class Step(NamedTuple):
    name: str
    from_version: int
    to_version: int
    migration_id: str
    fn: MigrationFn


class MigrationRegistry:
    """Migration steps keyed by (schema name, from version): at most one way forward from each."""

    def __init__(self) -> None:
        self._steps: dict[tuple[str, int], Step] = {}

    def register(
        self, name: str, from_version: int, to_version: int, migration_id: str
    ) -> Callable[[MigrationFn], MigrationFn]:
        """Decorator registering ``fn`` as the one step of schema ``name`` out of ``from_version``."""
        if not 0 <= from_version < to_version:
            msg = f"a migration goes forward between non-negative versions, not {from_version} -> {to_version}"
            raise ValueError(msg)
        if not migration_id or migration_id == IDENTITY or _CHAIN in migration_id:
            msg = f"migration id {migration_id!r} must be non-empty, not {IDENTITY!r}, without {_CHAIN!r}"
            raise ValueError(msg)
        if (name, from_version) in self._steps:
            msg = f"schema {name!r} already has a migration out of version {from_version}"
            raise ValueError(msg)
        if any(step.migration_id == migration_id for step in self._steps.values()):
            msg = f"migration id {migration_id!r} is already registered"
            raise ValueError(msg)

        def decorate(fn: MigrationFn) -> MigrationFn:
            self._steps[(name, from_version)] = Step(name, from_version, to_version, migration_id, fn)
            return fn

        return decorate

    def path(self, name: str, from_version: int, to_version: int) -> list[Step]:
        """The steps leading from ``from_version`` to ``to_version``, or ``MigrationMissing``."""
        steps: list[Step] = []
        version = from_version
        while version < to_version:
            step = self._steps.get((name, version))
            if step is None or step.to_version > to_version:
                target = "none" if step is None else f"only to version {step.to_version}"
                msg = (
                    f"no registered migration of schema {name!r} from version {version} towards "
                    f"{to_version} (from version {from_version}; registered: {target})"
                )
                raise MigrationMissing(msg)
            steps.append(step)
            version = step.to_version
        if version != to_version:
            msg = f"schema {name!r} cannot migrate back from version {from_version} to {to_version}"
            raise MigrationMissing(msg)
        return steps

    def migrate(
        self, state: dict[str, Any], name: str, from_version: int, to_version: int
    ) -> tuple[dict[str, Any], Migration]:
        """The state at ``to_version`` and the migration that produced it (identity when equal)."""
        steps = self.path(name, from_version, to_version)
        current = copy.deepcopy(state)
        for step in steps:
            current = step.fn(copy.deepcopy(current))
            if not isinstance(current, dict):
                msg = f"migration {step.migration_id!r} returned {type(current).__name__}, not a state object"
                raise TypeError(msg)
        migration_id = _CHAIN.join(step.migration_id for step in steps) or IDENTITY
        return current, Migration(name, from_version, name, to_version, migration_id)


REGISTRY = MigrationRegistry()
register = REGISTRY.register
migrate = REGISTRY.migrate


# -- the example schema: a coding agent's task state ------------------------------------------------
# v1: {"goal": str, "candidates": [{"patch": digest, "verdict": "pending" | "rejected" | "accepted"}]}


@register("coding-agent", 1, 2, "coding-agent/1-2/attempts")
def _count_attempts(state: dict[str, Any]) -> dict[str, Any]:
    """v2 adds ``attempts``: how many candidates the agent has produced so far."""
    return {**state, "attempts": len(state.get("candidates", []))}


@register("coding-agent", 2, 3, "coding-agent/2-3/rejections")
def _count_rejections(state: dict[str, Any]) -> dict[str, Any]:
    """v3 adds ``rejections``: how many of those candidates a verifier or approver turned down."""
    rejected = sum(1 for candidate in state.get("candidates", []) if candidate.get("verdict") == "rejected")
    return {**state, "rejections": rejected}
