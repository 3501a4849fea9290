"""``baton serve`` as a subprocess: the real CLI, its output read as an orchestrator reads it."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

__all__ = ["Serve", "finished", "serve", "wait_for_line"]

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 30.0  # generous: a loaded 2-core machine


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
    """The first line of stdout that contains ``text``; stdout ending first fails, showing stderr."""
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        if text in line:
            return line
        seen.append(line)
    raise AssertionError("".join(seen) + (process.stderr.read() if process.stderr else ""))


class Serve:
    """A ``baton serve`` process; its stdout lines are collected by a thread."""

    def __init__(self, bus_url: str, store_url: str, *args: str) -> None:
        command = [sys.executable, "-m", "baton.adapters.cli", "serve", "--bus", bus_url, "--store", store_url, *args]
        self.proc = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line)

    def wait_ready(self) -> None:
        while True:
            try:
                line = self.lines.get(timeout=TIMEOUT)
            except queue.Empty:
                raise AssertionError(f"baton serve not ready: {''.join(self.output)}") from None
            if "ready on" in line:
                return

    def kill(self) -> None:
        """SIGKILL: no drain, no goodbye to the bus (what a crash or an OOM kill looks like)."""
        self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> int:
        """SIGTERM, then the number of messages it answered (from its last line)."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        # the process has exited, so its stdout ends: once the reader has taken the last line, the output is complete
        self._reader.join(TIMEOUT)
        assert not self._reader.is_alive(), "the output of baton serve did not end after it exited"
        answered = [line for line in self.output if "stopped after answering" in line]
        return int(answered[-1].split("answering")[1].split()[0]) if answered else -1
