"""State-schema migrations: given a state at one version, when migrated, then this state and this Migration.

The example schema ``coding-agent`` is registered on the module's ``REGISTRY``; every other case
builds its own ``MigrationRegistry`` so tests never leak registrations into each other.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from baton.domain import errors
from baton.domain.handoff_document import IDENTITY, Migration
from baton.domain.migrations import REGISTRY, MigrationRegistry, migrate, register

V1: dict[str, Any] = {
    "goal": "make the tests pass",
    "candidates": [
        {"patch": "sha256:p1", "verdict": "rejected"},
        {"patch": "sha256:p2", "verdict": "rejected"},
        {"patch": "sha256:p3", "verdict": "pending"},
    ],
}


def test_v1_to_v2_adds_attempts_computed_from_the_candidates() -> None:
    """coding-agent v1 -> v2 adds attempts = number of candidates and keeps every other field."""
    state, migration = migrate(V1, "coding-agent", 1, 2)

    assert state == {**V1, "attempts": 3}
    assert migration == Migration("coding-agent", 1, "coding-agent", 2, "coding-agent/1-2/attempts")


def test_v1_to_v3_chains_both_steps_and_names_both() -> None:
    """Migrating two versions runs each registered step once, in order, and joins their ids with '+'."""
    state, migration = migrate(V1, "coding-agent", 1, 3)

    assert state == {**V1, "attempts": 3, "rejections": 2}
    assert migration.migration_id == "coding-agent/1-2/attempts+coding-agent/2-3/rejections"
    assert (migration.from_version, migration.to_version) == (1, 3)


def test_the_same_version_is_the_identity_migration() -> None:
    """Migrating to the version the state already has changes nothing and says so."""
    state, migration = migrate(V1, "coding-agent", 2, 2)

    assert state == V1
    assert migration == Migration.identity("coding-agent", 2)
    assert migration.migration_id == IDENTITY


def test_migrating_never_mutates_the_input() -> None:
    """The caller's state is untouched, even by a step that mutates its argument."""
    registry = MigrationRegistry()

    @registry.register("s", 1, 2, "s/1-2")
    def mutating(state: dict[str, Any]) -> dict[str, Any]:
        state["candidates"].append("!")
        state["added"] = True
        return state

    before = copy.deepcopy(V1)
    state, _ = registry.migrate(V1, "s", 1, 2)

    assert before == V1
    assert state["added"] is True
    assert state["candidates"][-1] == "!"


@pytest.mark.parametrize(
    ("name", "from_version", "to_version"),
    [("coding-agent", 1, 4), ("coding-agent", 0, 2), ("unknown-schema", 1, 2), ("coding-agent", 3, 1)],
    ids=["past_the_last_step", "no_step_out_of_v0", "unknown_schema", "backwards"],
)
def test_a_missing_path_is_refused(name: str, from_version: int, to_version: int) -> None:
    """Without a registered chain of steps, migrate refuses migration_missing, naming the schema."""
    with pytest.raises(errors.MigrationMissing) as caught:
        migrate(V1, name, from_version, to_version)

    assert caught.value.reason == "migration_missing"
    assert repr(name) in caught.value.message


def test_a_step_that_overshoots_the_target_is_refused() -> None:
    """A chain that cannot stop exactly at the target version is missing, not approximated."""
    registry = MigrationRegistry()
    registry.register("s", 1, 3, "s/1-3")(lambda state: state)

    with pytest.raises(errors.MigrationMissing, match="only to version 3"):
        registry.migrate({}, "s", 1, 2)
    assert registry.migrate({}, "s", 1, 3)[1].migration_id == "s/1-3"


@pytest.mark.parametrize(
    ("from_version", "to_version", "migration_id"),
    [(2, 2, "a"), (3, 2, "a"), (-1, 0, "a"), (1, 2, ""), (1, 2, IDENTITY), (1, 2, "a+b")],
    ids=["same_version", "backwards", "negative", "empty_id", "identity_id", "chain_separator"],
)
def test_registering_an_invalid_step_is_refused(from_version: int, to_version: int, migration_id: str) -> None:
    """A step goes forward between non-negative versions, with a plain non-identity id."""
    with pytest.raises(ValueError, match="migration"):
        MigrationRegistry().register("s", from_version, to_version, migration_id)


def test_registering_a_second_way_out_of_a_version_or_a_reused_id_is_refused() -> None:
    """Each (schema, version) has at most one step forward, and each migration id names one step."""
    registry = MigrationRegistry()
    registry.register("s", 1, 2, "s/1-2")(lambda state: state)

    with pytest.raises(ValueError, match="already has a migration"):
        registry.register("s", 1, 3, "s/1-3")
    with pytest.raises(ValueError, match="already registered"):
        registry.register("t", 1, 2, "s/1-2")


def test_a_step_returning_something_other_than_an_object_is_a_bug() -> None:
    """A step must return a state object; anything else is a TypeError naming the step."""
    registry = MigrationRegistry()
    registry.register("s", 1, 2, "s/1-2")(lambda state: [state])  # type: ignore[arg-type,return-value]

    with pytest.raises(TypeError, match="s/1-2"):
        registry.migrate({}, "s", 1, 2)


def test_the_module_registry_holds_only_the_example_schema() -> None:
    """Importing domain.migrations registers the coding-agent example and nothing else."""
    assert register == REGISTRY.register
    assert [(s.name, s.from_version, s.to_version) for s in REGISTRY.path("coding-agent", 1, 3)] == [
        ("coding-agent", 1, 2),
        ("coding-agent", 2, 3),
    ]
    assert REGISTRY._steps.keys() == {("coding-agent", 1), ("coding-agent", 2)}


def test_a_v1_state_without_candidates_migrates_to_zero_counts() -> None:
    """The example steps compute from whatever the state has: no candidates means zero attempts."""
    state, _ = migrate({"goal": "g"}, "coding-agent", 1, 3)

    assert state == {"goal": "g", "attempts": 0, "rejections": 0}
