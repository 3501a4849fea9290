"""Which migrations a store needs, from its recorded version and whether it has the baseline's tables."""

from __future__ import annotations

import pytest

from baton.adapters.eventstore.migrations import Migration, SchemaNotReady, plan, require_current

STEPS = (Migration(0, "versions", ("v0",)), Migration(1, "baseline", ("v1",)), Migration(2, "next", ("v2",)))


def test_a_new_store_gets_every_migration_in_order() -> None:
    """Given no version table and no tables, then every migration is applied, in order."""
    assert [m.version for m in plan(STEPS, None, baseline_present=False)] == [0, 1, 2]


def test_an_unversioned_store_with_the_baseline_skips_the_baselines_statements() -> None:
    """Given no version table but the baseline's tables, then the version table and what follows the baseline."""
    assert [m.version for m in plan(STEPS, None, baseline_present=True)] == [0, 2]


def test_a_versioned_store_gets_what_follows_its_version() -> None:
    """Given a recorded version, then only the later migrations; none at the latest."""
    assert [m.version for m in plan(STEPS, 1, baseline_present=True)] == [2]
    assert plan(STEPS, 2, baseline_present=True) == []


def test_a_store_newer_than_this_baton_is_refused() -> None:
    """Given a recorded version past the last migration, then planning refuses it."""
    with pytest.raises(SchemaNotReady, match="newer"):
        plan(STEPS, 3, baseline_present=True)


def test_migrations_out_of_order_are_a_programming_error() -> None:
    """Given migrations not numbered 0, 1, 2..., then planning refuses them."""
    with pytest.raises(ValueError, match="numbered"):
        plan((STEPS[0], STEPS[2]), None, baseline_present=False)


@pytest.mark.parametrize(
    ("recorded", "baseline", "message"),
    [(None, False, "no Baton schema"), (1, True, "version 1, this Baton needs 2"), (None, True, "version 1")],
)
def test_a_store_behind_is_refused_with_the_command_to_run(recorded: int | None, baseline: bool, message: str) -> None:
    """Given a store without the latest migration, then opening it is refused, naming ``baton store init``."""
    with pytest.raises(SchemaNotReady, match=message) as refusal:
        require_current(recorded, STEPS, baseline_present=baseline, store="the store")
    assert "baton store init" in str(refusal.value)
    assert not refusal.value.retryable


def test_a_store_at_the_latest_version_opens() -> None:
    """Given the latest version recorded (or a baseline store when the baseline is the latest), then no error."""
    require_current(2, STEPS, baseline_present=True, store="the store")
    require_current(None, STEPS[:2], baseline_present=True, store="the store")
