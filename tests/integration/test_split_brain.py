"""Split brain across OS processes: a deposed owner keeps writing while the new owner takes over.

Each process has its own store-side clock (a ``ManualClock``): the old owner's never moves, so by
its own reckoning its lease never expires; the new owner's runs an hour ahead, so it may expire
that lease and take epoch 2. Only the fence in the append transaction keeps the log single-writer.

A stalls (20 ms per append) only while B is taking over, as an owner stuck in a GC pause would;
between stalls and afterwards it appends as fast as it can. Without the stalls the takeover is
starved: both ExpireLease and AcquireLease compare-and-set the run's head, and A's appends win
every race (a liveness limit, not a safety one: A still never writes after B's grant).
"""

from __future__ import annotations

import multiprocessing
from typing import Any

from integration_support import (
    NEW_OWNER_APPENDS,
    REJECTIONS_TO_COLLECT,
    T0,
    LedgerFactory,
    RawStore,
    Submitter,
    new_owner,
    old_owner,
    open_run,
    reports_of,
)

from baton.adapters.clock import ManualClock
from baton.domain.events import LeaseExpired, LeaseGranted

RUN = "split-brain"
DEADLINE_S = 60.0  # a bound for a stuck run only: both loops stop as soon as they have what they need


def run_both(url: str) -> dict[str, tuple[list[dict[str, Any]], str | None]]:
    """Start A and B as spawned processes, collect their verdicts, and never leave one behind."""
    ctx = multiprocessing.get_context("spawn")
    running, striking, results = ctx.Event(), ctx.Event(), ctx.Queue()
    processes = [
        ctx.Process(target=role, args=(url, RUN, running, striking, results, DEADLINE_S), name=role.__name__)
        for role in (old_owner, new_owner)
    ]
    collected = {role: (verdicts, error) for role, verdicts, error in reports_of(processes, results, DEADLINE_S + 15)}
    assert [p.exitcode for p in processes] == [0, 0]
    return collected


def test_deposed_owner_never_writes_after_the_takeover(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given A at epoch 1 appending in a loop, when B in another process takes epoch 2, then A never lands after it."""
    ledger = ledgers(ManualClock(T0))
    assert open_run(ledger, RUN).position == 1
    assert Submitter(ledger, RUN, "A").acquire(ttl_ms=600_000).position == 2

    collected = run_both(store.url)

    (a_verdicts, a_error), (b_verdicts, b_error) = collected["A"], collected["B"]
    assert (a_error, b_error) == (None, None)
    history = list(ledger.history(RUN))
    n = len(history)
    assert [e.position for e in history] == list(range(1, n + 1))
    assert ledger.verify(RUN).events == n

    # The takeover: B's LeaseExpired of epoch 1, then B's LeaseGranted of epoch 2.
    [expired_at] = [e.position for e in history if isinstance(e.body, LeaseExpired)]
    [granted_at] = [e.position for e in history if isinstance(e.body, LeaseGranted) and e.body.epoch == 2]
    assert history[granted_at - 1].worker == "B"
    assert expired_at < granted_at
    assert all(e.epoch == 2 for e in history[granted_at:])
    assert not [e.position for e in history[expired_at:] if e.worker == "A"]
    assert all(e.worker == "A" and e.epoch == 1 for e in history[2 : expired_at - 1])

    # A's verdicts: accepted while it held the lease, then nothing but stale_epoch.
    outcomes = [v["verdict"] for v in a_verdicts]
    first_rejection = outcomes.index("rejected")
    assert first_rejection > 10  # A really was mid-loop when B struck
    assert set(outcomes[:first_rejection]) == {"accepted"}
    after = a_verdicts[first_rejection:]
    assert len(after) >= REJECTIONS_TO_COLLECT
    assert {(v["verdict"], v["reason"]) for v in after} == {("rejected", "stale_epoch")}
    assert {v["current_epoch"] for v in after} <= {1, 2}  # 1 only between B's expiry and B's grant
    assert after[-1]["current_epoch"] == 2
    assert max(v["position"] for v in a_verdicts[:first_rejection]) < expired_at

    # B: its takeover and all of its epoch-2 appends landed.
    b_accepted = [v for v in b_verdicts if v["verdict"] == "accepted"]
    b_gave_up = [v for v in b_verdicts if v["verdict"] != "accepted"]
    assert {v["reason"] for v in b_gave_up} <= {"concurrency_conflict"}  # lost races during the takeover
    assert len(b_accepted) == 2 + NEW_OWNER_APPENDS

    # Rejected appends stored nothing: every stored event is one accepted verdict, and vice versa.
    accepted = [v for v in a_verdicts + b_verdicts if v["verdict"] == "accepted"]
    assert n == 2 + len(accepted)
    assert sorted(v["position"] for v in accepted) == list(range(3, n + 1))
    assert [e.submission_id for e in history[2:]] == [v["submission_id"] for v in sorted(accepted, key=_position)]
    rejected_ids = {v["submission_id"] for v in a_verdicts + b_verdicts if v["verdict"] == "rejected"}
    assert not rejected_ids & store.submission_ids()
    assert store.event_count(RUN) == n


def _position(verdict: dict[str, Any]) -> int:
    position: int = verdict["position"]
    return position
