"""The state cache's working copy: given a cached state, when a decision changes its copy, then the
cached state is exactly as it was, and the copy did not duplicate what grows with the run."""

from __future__ import annotations

from baton.adapters.eventstore.state_cache import working_copy
from baton.domain.state import intended_ops
from tests.unit.domain.given import W1, given


def test_a_working_copy_changes_nothing_of_the_cached_state_and_shares_the_settled_op_ids() -> None:
    history = given().opened().leased(W1)
    for n in range(300):
        history.intended(f"op-{n}").observed(f"op-{n}")
    cached = history.state
    before = (intended_ops(cached), dict(cached.operations), cached.version, cached.usage)

    copy = working_copy(cached)
    history.state = copy
    history.intended("op-300")
    history.observed("op-300")

    assert (intended_ops(cached), dict(cached.operations), cached.version, cached.usage) == before
    assert "op-300" in intended_ops(copy)
    assert copy.op_ids is cached.op_ids  # immutable, so shared: a copy costs the recent ids only
    assert len(cached.recent_op_ids) < 256


def test_every_mutable_field_of_a_state_is_copied_not_shared() -> None:
    state = given().opened().leased(W1).intended("op-1").state
    copy = working_copy(state)

    for name in state.__struct_fields__:
        value = getattr(state, name)
        if isinstance(value, dict | set | list):
            assert getattr(copy, name) == value and getattr(copy, name) is not value, name
