"""Two LangGraph workers on one thread: the lease decides who writes, a stale worker never forks the thread.

Each saver has its own ledger (own connections and cache), as two processes would; they share a
manual clock so that lease expiry is decided by the test, not by the machine's speed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

from baton.adapters.bootstrap import init_store, open_ledger, register
from baton.adapters.clock import ManualClock
from baton.adapters.identity import SigningKey
from baton.adapters.langgraph import BatonSaver
from baton.domain import errors
from baton.domain.commands import AddPrincipal
from baton.domain.events import CheckpointRecorded

THREAD = "thread-1"
TTL_MS = 10_000


@pytest.fixture
def savers(store_url: str) -> Iterator[tuple[Any, Any, ManualClock, str]]:
    """Worker A's and worker B's savers on one initialised store, with one manual clock."""
    init_store(store_url)
    clock = ManualClock()
    a = BatonSaver.from_url(store_url, worker="worker-a", ttl_ms=TTL_MS, clock=clock)
    b = BatonSaver.from_url(store_url, worker="worker-b", ttl_ms=TTL_MS, clock=clock)
    yield a, b, clock, store_url
    a.close(release=False)
    b.close(release=False)


def _put_args(parent: dict[str, Any] | None, step: int) -> tuple[Any, ...]:
    """(config, checkpoint, metadata, new versions) of checkpoint ``step`` after ``parent``."""
    config = generate_config(THREAD)
    if parent is not None:
        config["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    checkpoint = generate_checkpoint(channel_values={"step": step}, channel_versions={"step": step + 1})
    return config, checkpoint, generate_metadata(step=step), {"step": step + 1}


def _put(saver: Any, parent: dict[str, Any] | None, step: int) -> dict[str, Any]:
    stored: dict[str, Any] = saver.put(*_put_args(parent, step))
    return stored


def _aput(saver: Any, parent: dict[str, Any] | None, step: int) -> dict[str, Any]:
    """``aput`` in an event loop of its own."""
    stored: dict[str, Any] = asyncio.run(saver.aput(*_put_args(parent, step)))
    return stored


def _checkpoint_writers(url: str) -> list[tuple[int, str]]:
    """(epoch, worker) of each checkpoint in the thread's log, after verifying its chain."""
    ledger = open_ledger(url)
    try:
        ledger.verify(THREAD)
        return [(e.epoch, e.worker) for e in ledger.history(THREAD) if isinstance(e.body, CheckpointRecorded)]
    finally:
        ledger.close()


def _ids(saver: Any) -> list[str]:
    return [t.config["configurable"]["checkpoint_id"] for t in saver.list(generate_config(THREAD))]


def test_stale_writer_is_rejected_and_the_thread_is_not_forked(savers: tuple[Any, Any, ManualClock, str]) -> None:
    """Given A wrote and its lease expired and B took over, when A writes again, then StaleEpoch and no fork."""
    a, b, clock, url = savers
    first = _put(a, None, 0)
    clock.advance(ms=TTL_MS + 1)
    second = _put(b, first, 1)  # B's first write takes the thread at epoch 2

    with pytest.raises(errors.StaleEpoch) as caught:
        _put(a, first, 1)  # A still believes it holds epoch 1 and branches from its own last checkpoint

    assert (caught.value.reason, caught.value.current_epoch) == ("stale_epoch", 2)
    assert _ids(b) == [second["configurable"]["checkpoint_id"], first["configurable"]["checkpoint_id"]]
    assert _checkpoint_writers(url) == [(1, "worker-a"), (2, "worker-b")]


def test_a_stale_writer_does_not_take_a_freed_thread_back(savers: tuple[Any, Any, ManualClock, str]) -> None:
    """Given A lost the thread to B and B released it, when A writes again, then StaleEpoch until A forgets."""
    a, b, clock, _ = savers
    first = _put(a, None, 0)
    clock.advance(ms=TTL_MS + 1)
    second = _put(b, first, 1)
    with pytest.raises(errors.StaleEpoch):
        _put(a, first, 1)
    b.release(THREAD)

    with pytest.raises(errors.StaleEpoch):
        _put(a, first, 1)  # the thread is free, but A would branch from a checkpoint B has moved past
    assert _ids(a) == [second["configurable"]["checkpoint_id"], first["configurable"]["checkpoint_id"]]

    a.forget(THREAD)  # A re-reads the thread and continues from B's checkpoint, at epoch 3
    latest = a.get_tuple(generate_config(THREAD))
    third = _put(a, latest.config, 2)
    assert a.get_tuple(generate_config(THREAD)).config == third


def test_a_second_writer_waits_while_the_lease_is_held(savers: tuple[Any, Any, ManualClock, str]) -> None:
    """Given A holds the thread's lease, when B writes to the thread, then LeaseHeld and nothing is stored."""
    a, b, _, _ = savers
    first = _put(a, None, 0)

    with pytest.raises(errors.LeaseHeld):
        _put(b, first, 1)

    assert _ids(a) == [first["configurable"]["checkpoint_id"]]


def test_a_worker_resumes_the_thread_after_a_clean_stop(savers: tuple[Any, Any, ManualClock, str]) -> None:
    """Given A wrote and released the thread, when B reads and writes, then B continues from A's checkpoint."""
    a, b, _, _ = savers
    first = _put(a, None, 0)
    a.release(THREAD)

    latest = b.get_tuple(generate_config(THREAD))
    assert latest is not None
    assert latest.checkpoint["channel_values"] == {"step": 0}
    second = _put(b, latest.config, 1)

    assert b.get_tuple(generate_config(THREAD)).parent_config["configurable"] == first["configurable"]
    assert _ids(a) == [second["configurable"]["checkpoint_id"], first["configurable"]["checkpoint_id"]]


def test_a_stale_async_writer_is_rejected_in_the_fenced_statement(store_url: str) -> None:
    """Given A's clock lags (A believes it still holds the lease) and B took over, when A calls aput, then the
    async append is refused in its statement, A gets StaleEpoch, and the thread is not forked."""
    init_store(store_url)
    clock_a, clock_b = ManualClock(), ManualClock()
    a = BatonSaver.from_url(store_url, worker="worker-a", ttl_ms=TTL_MS, clock=clock_a)
    b = BatonSaver.from_url(store_url, worker="worker-b", ttl_ms=TTL_MS, clock=clock_b)
    tries: list[object] = []
    asubmit = a.ledger.asubmit

    async def spy(*args: Any, **kwargs: Any) -> Any:
        tries.append(verdict := await asubmit(*args, **kwargs))
        return verdict

    a.ledger.asubmit = spy  # type: ignore[method-assign]
    try:
        first = _aput(a, None, 0)  # takes the lease (sync path)
        second = _aput(a, first, 1)  # the async path
        postgres = store_url.startswith("postgresql")
        assert [t is not None for t in tries] == ([True] if postgres else [])
        clock_b.advance(ms=TTL_MS + 1)
        third = _put(b, second, 2)

        with pytest.raises(errors.StaleEpoch) as caught:
            _aput(a, second, 2)

        assert (caught.value.reason, caught.value.current_epoch) == ("stale_epoch", 2)
        assert [t is not None for t in tries] == ([True, False] if postgres else [])
        ids = [c["configurable"]["checkpoint_id"] for c in (third, second, first)]
        assert _ids(b) == ids
        assert [t.config["configurable"]["checkpoint_id"] for t in asyncio.run(_alist(a))] == ids
    finally:
        a.close(release=False)
        b.close(release=False)
    assert _checkpoint_writers(store_url) == [(1, "worker-a"), (1, "worker-a"), (2, "worker-b")]


async def _alist(saver: Any) -> list[Any]:
    return [t async for t in saver.alist(generate_config(THREAD))]


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)  # SQLite has no asyncio append
def test_a_committed_async_put_whose_reply_is_lost_is_not_appended_again(store_url: str) -> None:
    """Given an async put that commits but whose reply is lost, and a lease that expires before the fallback,
    when the saver falls back (taking the lease again, at a new epoch), then it finds the committed try and
    the checkpoint is in the log once."""
    init_store(store_url)
    clock = ManualClock()
    a = BatonSaver.from_url(store_url, worker="worker-a", ttl_ms=TTL_MS, clock=clock)
    asubmit = a.ledger.asubmit

    async def reply_lost(*args: Any, **kwargs: Any) -> Any:
        assert await asubmit(*args, **kwargs) is not None  # committed
        clock.advance(ms=TTL_MS + 1)  # and the lease expires before the caller hears of it
        return None

    try:
        first = _aput(a, None, 0)  # takes the lease (sync path)
        a.ledger.asubmit = reply_lost  # type: ignore[method-assign]
        second = _aput(a, first, 1)

        assert _ids(a) == [second["configurable"]["checkpoint_id"], first["configurable"]["checkpoint_id"]]
    finally:
        a.close(release=False)
    assert _checkpoint_writers(store_url) == [(1, "worker-a"), (1, "worker-a")]


def test_in_a_signed_store_a_saver_signs_and_one_without_its_key_writes_nothing(store_url: str) -> None:
    """Given a store that verifies identities, when a saver with its principal's key puts (sync and
    async), then both are stored, signed; a saver of the same name without the key is refused."""
    operator, key = SigningKey.generate(), SigningKey.generate()
    init_store(store_url, operator_key=operator)
    assert register(store_url, operator, AddPrincipal("worker-a", ("worker",), key.public_key)).verdict == "accepted"
    signed = BatonSaver.from_url(store_url, worker="worker-a", ttl_ms=TTL_MS, key=key)
    unsigned = BatonSaver.from_url(store_url, worker="worker-a", ttl_ms=TTL_MS)
    try:
        first = _put(signed, None, 0)
        _aput(signed, first, 1)
        with pytest.raises(errors.SignatureRequired):
            _put(unsigned, first, 1)
    finally:
        signed.close(release=False)
        unsigned.close(release=False)
    ledger = open_ledger(store_url)
    try:
        events = list(ledger.history(THREAD))
    finally:
        ledger.close()
    assert sum(isinstance(e.body, CheckpointRecorded) for e in events) == 2
    assert all(e.signature for e in events)
