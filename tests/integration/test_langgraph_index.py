"""The thread index follows a writer's own appends without a read having to catch it up."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any
from unittest.mock import Mock

import pytest
from eventsourcing.persistence import OperationalError
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

from baton.adapters.bootstrap import init_store
from baton.adapters.clock import ManualClock
from baton.adapters.eventstore.blobs import SqlConnection
from baton.adapters.langgraph import BatonSaver
from baton.adapters.langgraph.document import decode_document, referenced_digests

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


def test_concurrent_async_writes_all_land_and_the_chain_holds(store_url: str) -> None:
    """Given one event loop, when many aput_writes on one thread and aputs on several threads run at once
    (some take the async append, the rest a worker thread), then every write is listed and each chain verifies."""
    init_store(store_url)

    async def scenario(saver: BatonSaver) -> tuple[Any, list[Any]]:
        def checkpoint(step: int) -> Any:
            return generate_checkpoint(channel_values={"step": step}, channel_versions={"step": step + 1})

        base = await saver.aput(generate_config("busy"), checkpoint(0), generate_metadata(step=0), {"step": 1})
        await saver.aput(base, checkpoint(1), generate_metadata(step=1), {"step": 2})  # the lease is held now
        writes = [saver.aput_writes(base, [("notes", f"n{i}")], f"task-{i:02d}") for i in range(12)]
        puts = [
            saver.aput(generate_config(f"other-{i}"), checkpoint(i), generate_metadata(step=i), {"step": i + 1})
            for i in range(6)
        ]
        await asyncio.gather(*writes, *puts)
        return await saver.aget_tuple(base), [await saver.aget_tuple(generate_config(f"other-{i}")) for i in range(6)]

    with BatonSaver.from_url(store_url, worker="w") as saver:
        found, others = asyncio.run(scenario(saver))
        assert sorted(w[0] for w in found.pending_writes) == [f"task-{i:02d}" for i in range(12)]
        assert all(t is not None for t in others)
        for thread in ["busy", *(f"other-{i}" for i in range(6))]:
            saver.ledger.verify(thread)


def test_small_values_live_in_the_document_and_large_ones_in_blobs(store_url: str) -> None:
    """Given a checkpoint with a small and a large channel value, when it is put and read back, then only
    the large value (and the document) is a blob of its own, and both values read back as they were."""
    init_store(store_url)
    with BatonSaver.from_url(store_url, worker="w") as saver:
        values = {"small": 7, "large": "x" * 200}
        checkpoint = generate_checkpoint(channel_values=values, channel_versions={"small": 1, "large": 1})
        stored = saver.put(generate_config("mixed"), checkpoint, generate_metadata(), {"small": 1, "large": 1})
        found = saver.get_tuple(stored)
        assert found is not None and found.checkpoint["channel_values"] == values
        row = saver.index.lookup("mixed", "", None)[2]
        assert row is not None
        document = decode_document(row.document)
        assert list(document.channels) == ["large"] and list(document.inline) == ["small"]
        assert referenced_digests(row.document) == [document.channels["large"][1]]


def test_a_put_whose_fold_fails_to_record_leaves_that_fold_pending(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a put whose previous fold cannot be recorded (a store error), when the put fails and the next
    one succeeds, then that fold lands with the next put: the index stands one append behind the head."""
    init_store(store_url)
    with BatonSaver.from_url(store_url, worker="w") as saver:
        _put(saver, "failing", 0)
        record = saver.index.record
        monkeypatch.setattr(saver.index, "record", Mock(side_effect=OperationalError("the store went away")))
        with pytest.raises(OperationalError):
            _put(saver, "failing", 1)
        monkeypatch.setattr(saver.index, "record", record)
        _put(saver, "failing", 2)
        head, indexed = saver.index.heads("failing")
        assert head is not None and indexed == head - 1
        assert (saver.index.cas_misses, saver.index.catch_ups) == (0, 0)


def test_a_sqlite_cursor_is_closed_when_its_block_ends(tmp_path: Path) -> None:
    """Given the SQLite side connection, when a cursor's block ends, then the cursor is closed: freed later,
    outside the connection's lock, it would reset a statement another thread may be running."""
    url = f"sqlite:///{tmp_path / 'baton.db'}"
    init_store(url)
    conn = SqlConnection(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1").fetchone()
        with pytest.raises(sqlite3.ProgrammingError, match="closed cursor"):
            cur.execute("SELECT 1")
    finally:
        conn.close()
