"""Lease liveness (docs/operations.md, "Lease liveness"): a dead holder does not hold its run hostage.

Given a worker in another process holding a run's lease with its liveness session declared, when
that process is SIGKILLed, then a new worker takes the lease within two seconds (``LeaseExpired``
with ``session_gone``, a bigger epoch) and the old holder's late append is ``stale_epoch``. A live
holder that merely stops appending, a lease without a session, and a worker declaring the holder's
own live session all keep the ttl. Both backends, through the real stores.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.process import BaseProcess

import pytest
from integration_support import LedgerFactory, RawStore, intent, open_run
from lease_support import HOLDER, hold_lease

from baton.adapters.cli import main
from baton.adapters.clock import ManualClock, SystemClock
from baton.adapters.eventstore import RunLedger
from baton.adapters.worker import LedgerTransport, Worker
from baton.domain import errors
from baton.domain.commands import AcquireLease, ExpireLease, Submission
from baton.domain.events import LeaseExpired, LeaseGranted, Placement
from baton.projections.audit import audit_events

RUN = "liveness-run"
TAKEOVER_WITHIN_S = 2.0
TTL_S = 30  # the worker's default ttl


@dataclass(frozen=True)
class Holder:
    process: BaseProcess
    epoch: int
    session: str


@pytest.fixture
def ledger(ledgers: LedgerFactory) -> RunLedger:
    """A ledger on the system clock (the holder's process judges by it too), with the run opened."""
    opened = ledgers(SystemClock())
    assert open_run(opened, RUN).verdict == "accepted"
    return opened


@pytest.fixture
def holders(store: RawStore) -> Iterator[Callable[..., Holder]]:
    """Starts the lease holder in a process of its own and waits until it holds the lease."""
    started: list[BaseProcess] = []
    ctx = multiprocessing.get_context("spawn")

    def start(*, liveness: bool = True) -> Holder:
        mine, theirs = ctx.Pipe()
        process = ctx.Process(target=hold_lease, args=(store.url, RUN, liveness, theirs), daemon=True)
        process.start()
        started.append(process)
        assert mine.poll(60), "the holder never acquired the lease"
        epoch, session = mine.recv()
        return Holder(process, epoch, session)

    yield start
    for process in started:
        if process.is_alive():
            process.kill()
        process.join(10)


def take_over(worker: Worker, within_s: float) -> tuple[int, float]:
    """Acquire until accepted or ``within_s`` passed: the epoch, and how long it took."""
    start = time.monotonic()
    while True:
        try:
            return worker.acquire(RUN), time.monotonic() - start
        except errors.LeaseHeld:
            if time.monotonic() - start > within_s:
                raise
            time.sleep(0.02)


def refused_for(worker: Worker, seconds: float) -> None:
    """The worker's acquire is refused ``lease_held`` every time it tries for ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with pytest.raises(errors.LeaseHeld):
            worker.acquire(RUN)
        time.sleep(0.1)


def lease_case(url: str, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    """What ``baton resume RUN --json`` says about the lease."""
    capsys.readouterr()
    assert main(["resume", RUN, "--worker", "b", "--json", "--store", url]) == 0
    case: dict[str, object] = json.loads(capsys.readouterr().out)["lease"]
    return case


def new_worker(ledger: RunLedger, name: str = "worker-b") -> Worker:
    return Worker(Placement(name), LedgerTransport(ledger), ledger)


def test_a_killed_holders_lease_is_taken_over_within_two_seconds_and_its_late_append_is_stale(
    store: RawStore, ledger: RunLedger, holders: Callable[..., Holder], capsys: pytest.CaptureFixture[str]
) -> None:
    """Given a holder with a session, when SIGKILLed, then a new worker takes the lease within 2 s, the expiry
    says session_gone, and an append at the old epoch is stale_epoch and stores nothing."""
    holder = holders()
    assert holder.epoch == 1 and holder.session.startswith(("pg:", "proc:"))

    holder.process.kill()  # not reaped yet: a zombie is no holder either
    with new_worker(ledger) as b:
        epoch, took = take_over(b, TAKEOVER_WITHIN_S)

    assert took < TAKEOVER_WITHIN_S and epoch == 2
    expired, granted = (event.body for event in list(ledger.history(RUN))[-2:])
    assert isinstance(expired, LeaseExpired) and isinstance(granted, LeaseGranted)
    assert (expired.worker, expired.epoch, expired.session_gone) == (HOLDER, 1, True)
    assert (granted.worker, granted.epoch, granted.session) == ("worker-b", 2, ledger.session())
    assert audit_events(RUN, list(ledger.history(RUN))) == []  # the early expiry is one the auditor accepts
    assert lease_case(store.url, capsys)["status"] == "live"  # worker-b's own lease

    events, ids = store.event_count(RUN), store.submission_ids()
    late = ledger.submit(Submission("late-append", RUN, HOLDER, intent("late"), holder.epoch))
    assert (late.verdict, late.reason, late.current_epoch) == ("rejected", "stale_epoch", 2)
    assert (store.event_count(RUN), store.submission_ids()) == (events, ids)


def test_baton_resume_says_the_holders_session_is_gone(
    store: RawStore, ledger: RunLedger, holders: Callable[..., Holder], capsys: pytest.CaptureFixture[str]
) -> None:
    """Given a killed holder whose lease is within its ttl, `baton resume` names the case: session gone."""
    holder = holders()
    assert lease_case(store.url, capsys) | {"expires_at": "-"} == {
        "status": "live",
        "holder": HOLDER,
        "epoch": 1,
        "expires_at": "-",
        "session": True,
    }
    holder.process.kill()
    holder.process.join(10)

    deadline = time.monotonic() + TAKEOVER_WITHIN_S
    while (case := lease_case(store.url, capsys))["status"] != "session_gone" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert case["status"] == "session_gone"
    assert main(["resume", RUN, "--worker", "b", "--store", store.url]) == 0
    assert "lease: holder's session gone (epoch 1 held by holder-a)" in capsys.readouterr().out


def test_a_live_holder_that_stops_appending_keeps_its_lease_until_the_ttl(
    ledger: RunLedger, holders: Callable[..., Holder]
) -> None:
    """Given a holder alive but idle, a new worker's acquire is refused lease_held, again and again."""
    holder = holders()

    with new_worker(ledger) as b:
        refused_for(b, seconds=1.5)

    assert holder.process.is_alive()
    assert ledger.state(RUN).holder == HOLDER


def test_a_lease_acquired_without_a_session_keeps_its_ttl_after_the_holder_dies(
    ledger: RunLedger, ledgers: LedgerFactory, holders: Callable[..., Holder]
) -> None:
    """Given a holder that declared no session, when it is killed, the lease lasts its ttl, then expires plainly."""
    holder = holders(liveness=False)
    assert holder.session == ""
    holder.process.kill()
    holder.process.join(10)

    with new_worker(ledger) as b:
        refused_for(b, seconds=1.0)
    later = ledgers(ManualClock(SystemClock().now() + (TTL_S + 1) * 1_000_000))
    with new_worker(later) as b:
        assert b.acquire(RUN) == 2
    expired = list(later.history(RUN))[-2].body
    assert isinstance(expired, LeaseExpired) and not expired.session_gone


def test_a_worker_declaring_the_live_holders_session_cannot_take_over_early(
    ledger: RunLedger, holders: Callable[..., Holder]
) -> None:
    """Whose session counts is the store's to say: declaring the holder's own live token gains nothing."""
    holder = holders()

    for command in (AcquireLease(Placement("worker-c"), session=holder.session), ExpireLease()):
        verdict = ledger.submit(Submission(f"c-{type(command).__name__}", RUN, "worker-c", command, 0))
        assert (verdict.verdict, verdict.reason) == ("rejected", "lease_held")
    assert ledger.session_alive(holder.session)


def test_unknown_or_malformed_session_tokens_count_as_alive(ledger: RunLedger) -> None:
    """A token the store cannot judge keeps the lease for its ttl: the safe side."""
    for token in ("", "x", "pg:1:2", "pg:a:b:c", "proc:x", "proc:boot:ns:1:2", "redis:abc", "pg:1:2:3", "proc:1:2:3:4"):
        assert ledger.session_alive(token), token
    assert ledger.session_alive(ledger.session())


def test_a_token_whose_pid_now_names_a_later_process_or_backend_is_gone(ledger: RunLedger) -> None:
    """The start time is part of the session: a reused pid never passes for the holder."""
    *named, started = ledger.session().split(":")

    assert not ledger.session_alive(":".join([*named, str(int(started) + 1)]))


def test_a_partitioned_holder_whose_session_ended_is_fenced_after_the_takeover(
    store: RawStore, ledgers: LedgerFactory
) -> None:
    """Given a live holder whose session the server ended (as its keepalives do to a partitioned client), when
    another worker takes over early, then the holder's next append is stale_epoch: fencing is the safety net."""
    if store.backend != "postgres":
        pytest.skip("a SQLite session is the process itself: it cannot end while the holder lives")
    a_ledger, b_ledger = ledgers(SystemClock()), ledgers(SystemClock())
    assert open_run(a_ledger, RUN).verdict == "accepted"
    with new_worker(a_ledger, HOLDER) as a, new_worker(b_ledger) as b:
        assert a.acquire(RUN) == 1
        pid = int(a_ledger.session().split(":")[2])
        store.query("SELECT pg_terminate_backend(?)", (pid,))

        epoch, _ = take_over(b, TAKEOVER_WITHIN_S)
        assert epoch == 2
        events = store.event_count(RUN)
        with pytest.raises(errors.StaleEpoch) as stale:
            a.submit(RUN, intent("after-the-partition"))
        assert stale.value.current_epoch == 2
        assert store.event_count(RUN) == events
