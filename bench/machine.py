"""What every benchmark records next to its numbers: the machine, the code and the load."""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

__all__ = ["git_state", "machine_info"]

ROOT = Path(__file__).resolve().parents[1]


def git_state() -> str:
    """The commit measured, and whether the working tree had uncommitted changes."""
    try:
        run = functools.partial(subprocess.run, cwd=ROOT, capture_output=True, text=True, timeout=10, check=True)
        commit = run(["git", "rev-parse", "--short", "HEAD"]).stdout.strip()
        dirty = run(["git", "status", "--porcelain", "--untracked-files=no"]).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    return f"{commit}{' + uncommitted changes' if dirty else ''}"


def machine_info() -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = {}
    for dist in ("eventsourcing", "psycopg", "psycopg-binary", "msgspec"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "code": git_state(),
        "nproc": f"{len(os.sched_getaffinity(0))} (os.cpu_count={os.cpu_count()})",
        "cpu": cpu,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        **versions,
    }
