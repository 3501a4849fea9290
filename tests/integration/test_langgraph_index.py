"""The thread index follows a writer's own appends without a read having to catch it up."""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

from adapters.bootstrap import init_store
from adapters.clock import ManualClock
from adapters.langgraph import BatonSaver

TTL_MS = 10_000


def _put(saver: Any, thread: str, step: int) -> Any:
    checkpoint = generate_checkpoint(channel_values={"step": step}, channel_versions={"step": step + 1})
    return saver.put(generate_config(thread), checkpoint, generate_metadata(step=step), {"step": step + 1})


def test_each_append_folds_the_previous_one_into_the_index(store_url: str) -> None:
    """Given a new thread, when a saver puts checkpoints and writes without reading, then the index stands one
    append behind the head (the last fold waits for the next append or read) and a read finds no gap."""
    init_store(store_url)
    with BatonSaver.from_url(store_url, worker="w") as saver:
        stored = [_put(saver, "fresh", step) for step in range(3)]
        saver.put_writes(stored[-1], [("notes", "n")], "task-1")
        _put(saver, "fresh", 3)
        head, indexed = saver.index.heads("fresh")
        assert head is not None and indexed == head - 1
        assert len(list(saver.list(generate_config("fresh")))) == 4
        assert saver.index.heads("fresh") == (head, head)


def test_a_lease_renewal_does_not_leave_the_index_behind(store_url: str) -> None:
    """Given a saver whose lease is renewed inside a put, when it puts again, then the fold still lands."""
    init_store(store_url)
    clock = ManualClock()
    with BatonSaver.from_url(store_url, worker="w", ttl_ms=TTL_MS, clock=clock) as saver:
        _put(saver, "renewed", 0)
        clock.advance(ms=TTL_MS * 3 // 4)  # less than half the ttl left: the next put renews
        _put(saver, "renewed", 1)
        _put(saver, "renewed", 2)
        head, indexed = saver.index.heads("renewed")
        assert head is not None and indexed == head - 1
