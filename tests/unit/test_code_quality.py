"""The project's static checks run as part of the one test command, so CI cannot skip them."""

from __future__ import annotations

import re
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


_LIBRARIES = r"(?:nats|eventsourcing|psycopg|psycopg_pool|faststream)"
_FORBIDDEN = {
    "generated code (exec/compile)": re.compile(r"(?<![\w.])(?:exec|compile)\("),
    "a private name of a library": re.compile(
        rf"from {_LIBRARIES}[\w.]* import [^#\n]*\b_[A-Za-z]|import {_LIBRARIES}[\w.]*\._"
    ),
}


def test_the_package_runs_no_generated_code_and_imports_no_private_library_name() -> None:
    """Given every module of the package, when read, then none runs generated source or imports a private
    name of nats, eventsourcing, psycopg or faststream (their public APIs only)."""
    found = [
        f"{path.relative_to(ROOT)}:{number}: {what}"
        for folder in ("domain", "projections", "adapters")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for what, pattern in _FORBIDDEN.items()
        if pattern.search(line)
    ]

    assert found == []
