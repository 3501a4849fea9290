"""The project's static checks run as part of the one test command, so CI cannot skip them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)


@pytest.mark.parametrize(
    "command",
    [
        ("ruff", "check", "."),
        ("ruff", "format", "--check", "."),
        (sys.executable, "-m", "mypy"),
        ("lint-imports",),
    ],
    ids=["ruff-check", "ruff-format", "mypy-strict-domain", "import-contracts"],
)
def test_static_check_passes(command: tuple[str, ...]) -> None:
    """Given the source tree, when the static check runs, then it reports no problem."""
    if command[0] != sys.executable and shutil.which(command[0]) is None:
        pytest.fail(f"{command[0]} is not installed: install the test extra")
    result = _run(*command)
    assert result.returncode == 0, result.stdout + result.stderr
