"""``RunLedger.asubmit``: the same decision and fenced statement as ``submit``, awaited from an event loop."""

from __future__ import annotations

import asyncio

import pytest
from integration_support import LedgerFactory, RawStore, Submitter, intent, observation, open_run, positions

from baton.adapters.clock import ManualClock


def test_an_async_append_is_one_link_of_the_chain_and_its_retry_is_a_duplicate(
    store: RawStore, ledgers: LedgerFactory
) -> None:
    """Given a held lease, when a submission is awaited and then retried in sync, then accepted once, then duplicate."""
    ledger = ledgers()
    open_run(ledger, "r1")
    worker = Submitter(ledger, "r1", "w1")
    worker.acquire()
    submission = worker.submission(intent("op-1"))

    verdict = asyncio.run(ledger.asubmit(submission))

    if store.backend == "sqlite":  # no asyncio connection: the caller takes the sync path
        assert verdict is None
        return
    assert verdict is not None and (verdict.verdict, verdict.position) == ("accepted", 3)
    retry = ledger.submit(submission)
    assert (retry.verdict, retry.position) == ("duplicate", 3)
    assert worker.submit(observation("op-1")).position == 4  # the sync path continues the same chain
    assert positions(ledger, "r1") == [1, 2, 3, 4]
    assert ledger.verify("r1").events == 4


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)  # SQLite has no asyncio append
def test_a_stale_async_append_is_refused_in_its_statement(store: RawStore, ledgers: LedgerFactory) -> None:
    """Given another worker took the lease, when the old holder's cached state is used in an async append,
    then nothing is appended (None: the sync path explains) and the sync path rejects it as stale."""
    old_clock, new_clock = ManualClock(), ManualClock()
    old, new = ledgers(old_clock), ledgers(new_clock)
    open_run(old, "r1")
    a = Submitter(old, "r1", "w-a")
    a.acquire(ttl_ms=1_000)
    assert a.submit(intent("op-1")).verdict == "accepted"  # caches the run at epoch 1 in ``old``
    new_clock.advance(ms=2_000)
    b = Submitter(new, "r1", "w-b")
    assert b.acquire().verdict == "accepted"  # epoch 2, written by another ledger (another process)
    stale = a.submission(intent("op-2"))
    log = positions(new, "r1")

    assert asyncio.run(old.asubmit(stale)) is None
    verdict = old.submit(stale)

    assert (verdict.verdict, verdict.reason, verdict.current_epoch) == ("rejected", "stale_epoch", 2)
    assert positions(new, "r1") == log  # nothing of the stale submission was stored
    assert new.verify("r1").events == len(log)
