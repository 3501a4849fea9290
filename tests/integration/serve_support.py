"""``baton serve`` as a subprocess: the real CLI, its output read as an orchestrator reads it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["finished", "serve", "wait_for_line"]


def serve(cwd: Path, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "BATON_STORE"}
    return subprocess.Popen(
        [sys.executable, "-m", "baton.adapters.cli", "serve", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(process: subprocess.Popen[str], within: float) -> tuple[int, str, str, float]:
    started = time.monotonic()
    stdout, stderr = process.communicate(timeout=within + 30)  # the margin only to report a slow exit
    return process.returncode, stdout, stderr, time.monotonic() - started


def wait_for_line(process: subprocess.Popen[str], text: str) -> str:
    """The next line of stdout, which must contain ``text`` (else the failure shows stderr)."""
    assert process.stdout is not None
    line = process.stdout.readline()
    assert text in line, line + (process.stderr.read() if process.stderr else "")
    return line
