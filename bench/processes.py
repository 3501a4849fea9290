"""The processes a benchmark starts beside itself (a service, a responder), and the CPU they use."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = ["process_cpu", "ready_process"]

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def ready_process(command: list[str], *, env: Mapping[str, str] | None = None) -> Iterator[int]:
    """``command`` started in the repository, once it printed a line with "ready" (lines before it,
    such as ``baton serve``'s "connecting to ...", are skipped); yields its pid, stops it afterwards."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT, env=env)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "ready" in line:
                break
        else:
            raise RuntimeError(f"{command[1:3]} exited with {proc.wait()} before it was ready")
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
