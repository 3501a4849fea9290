"""The ledger's cache of run states, and the per-run locks that serialise decisions in this process.

A cached state is always a prefix of the run's log: only states that hold stored events are put
here, and a decision is made on a copy (``working_copy``), so a failed append leaves nothing to undo.
A cached state may be behind the log (another process appended); the fence catches a decision made
on it, and the ledger then reads the tail and decides again.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence

import msgspec

from baton.domain.state import RunState

__all__ = ["CACHE_SIZE", "StateCache", "working_copy"]

CACHE_SIZE = 1024
_STRIPES = 64


# RunState's mutable fields: those whose default is a container (``op_ids`` is a frozenset: shared)
_CONTAINERS = tuple(
    field.name
    for field in msgspec.structs.fields(RunState)
    if isinstance(field.default, dict | set | list) or field.default_factory in (dict, set, list)
)


def working_copy(state: RunState) -> RunState:
    """A copy of ``state`` that can be changed without touching ``state``.

    Every container field (operations, recent op ids, grants, ...) is copied one level deep; what
    they hold (strings and frozen structs) is immutable and shared.
    """
    return msgspec.structs.replace(state, **{name: copy.copy(getattr(state, name)) for name in _CONTAINERS})


class StateCache:
    """Least recently used run states, at most ``size``, and striped locks over run ids."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self._size = size
        self._states: OrderedDict[str, RunState] = OrderedDict()
        self._lock = threading.Lock()
        self._stripes = [threading.Lock() for _ in range(_STRIPES)]

    def get(self, run_id: str) -> RunState | None:
        """The cached state (marked most recently used), or None. Callers never change it."""
        with self._lock:
            state = self._states.get(run_id)
            if state is not None:
                self._states.move_to_end(run_id)
            return state

    def put(self, states: Iterable[RunState]) -> None:
        """Cache ``states``: each must hold only events that are stored."""
        with self._lock:
            for state in states:
                self._states[state.run_id] = state
                self._states.move_to_end(state.run_id)
            while len(self._states) > self._size:
                self._states.popitem(last=False)

    def forget(self, run_ids: Iterable[str]) -> None:
        """Drop the cached states: the next decision folds the runs again from the log."""
        with self._lock:
            for run_id in run_ids:
                self._states.pop(run_id, None)

    def stripe(self, run_id: str) -> threading.Lock:
        """The lock a decision on ``run_id`` holds in this process (the store fences across processes)."""
        return self._stripes[hash(run_id) % len(self._stripes)]

    @contextlib.contextmanager
    def locked(self, run_ids: Sequence[str]) -> Iterator[None]:
        """Hold the locks of every run in ``run_ids``, taken in one order so two batches cannot deadlock."""
        stripes = sorted({hash(run_id) % len(self._stripes) for run_id in run_ids})
        with contextlib.ExitStack() as stack:
            for stripe in stripes:
                stack.enter_context(self._stripes[stripe])
            yield
