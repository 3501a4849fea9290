"""Liveness sessions: when the write path asks about one, and how a SQLite store judges its own.

A lease that declared a session may be taken over before its ttl once the store sees that session
end (``domain.decide``, ``holder_gone``). The write path asks only when that could change the
answer (``session_to_judge``: a takeover or expiry of a live lease that declared a session), so
an ordinary append costs no extra query.

A SQLite store lives on one host, so a worker's session is its process: the token names the kernel
boot and pid namespace it was made in, the pid, and the process's start time (``/proc/<pid>/stat``),
so a pid reused by a later process never passes for the holder. Only standard library calls; where
``/proc`` is missing, no token is made (the lease lasts its ttl).

Judging a token errs towards *alive*: a token that is malformed, from another boot, another pid
namespace (a container sharing the file) or another host cannot be checked from here, and calling
it gone would let a live worker lose its lease early. Once a token is judged gone it stays gone
(the process cannot come back), so a decision on that answer stays true until its append commits.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path

from baton.domain.commands import AcquireLease, ExpireLease, Submission
from baton.domain.state import RunState

__all__ = ["PROCESS_PREFIX", "process_alive", "process_token", "session_to_judge"]

PROCESS_PREFIX = "proc:"
_PROC = Path("/proc")
_GONE_STATES = frozenset("ZX")  # a zombie (killed, not yet reaped) or dead process runs nothing


def session_to_judge(state: RunState, submission: Submission, now: int) -> str:
    """The holder's session whose end would let ``submission`` take over the lease early, else "".

    Only the store judges it (``holder_gone``), never the worker that wants the lease.
    """
    lease = state.lease
    if not isinstance(submission.command, AcquireLease | ExpireLease) or lease is None or now >= lease.expires_at:
        return ""
    return lease.session


def process_token() -> str:
    """This process's session token: ``proc:<boot>:<pid namespace>:<pid>:<start time>``, or "" without /proc."""
    started = _start_time(os.getpid())
    if started is None:
        return ""
    return f"{PROCESS_PREFIX}{_host()}:{_pid_namespace()}:{os.getpid()}:{started}"


def process_alive(token: str) -> bool:
    """Whether the process ``token`` names may still run: False only when this host can prove it ended."""
    parts = token.split(":")
    if len(parts) != 5 or parts[0] != PROCESS_PREFIX[:-1] or not (parts[3].isdigit() and parts[4].isdigit()):
        return True  # not a token this module made: unknown, so alive
    _, host, namespace, pid, started = parts
    if host != _host() or namespace != _pid_namespace():
        return True  # made elsewhere: this host cannot see that process
    return _start_time(int(pid)) == int(started)


@functools.cache
def _host() -> str:
    """The kernel boot id (a new one every boot, shared by the containers of one kernel), else the hostname."""
    try:
        return (_PROC / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return socket.gethostname()


@functools.cache
def _pid_namespace() -> str:
    """The pid namespace's inode: a pid means the same process only within one namespace."""
    try:
        return os.readlink(_PROC / "self/ns/pid").removeprefix("pid:[").removesuffix("]")
    except OSError:
        return "-"


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if no live process has that pid."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: the fields after it follow the last ")"
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) < 20 or fields[0] in _GONE_STATES:
        return None
    return int(fields[19])  # field 22 of proc(5): starttime
