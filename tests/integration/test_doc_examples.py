"""The examples in docs/worker.md and docs/agents.md are real programs: each runs and prints what its page says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize("page", ["worker.md", "agents.md"])
def test_the_documented_example_runs_and_prints_what_the_page_says(tmp_path: Path, page: str) -> None:
    """Given the page's only Python block, when run as a script, then its output is the documented one."""
    text = (DOCS / page).read_text(encoding="utf-8")
    [program] = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    promised = re.findall(r"It prints `([^`]*)` and `([^`]*)`", text)
    script = tmp_path / "example.py"
    script.write_text(program, encoding="utf-8")

    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False)

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == list(promised[0])
