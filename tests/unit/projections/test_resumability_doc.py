"""docs/resumability.md stays true: each worked example is exactly what the code answers today."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from .scenarios import BUILDERS, Scenario, render

DOC = Path(__file__).resolve().parents[3] / "docs" / "resumability.md"


@pytest.mark.parametrize("build", BUILDERS, ids=[build.__name__ for build in BUILDERS])
def test_worked_example_in_the_doc_matches_the_code(build: Callable[[], Scenario]) -> None:
    """Given the example's history and target, the doc shows exactly its table and classification."""
    scenario = build()

    assert render(scenario) in DOC.read_text(encoding="utf-8"), (
        f"docs/resumability.md is stale for {scenario.key}: regenerate with python -m tests.unit.projections.scenarios"
    )
