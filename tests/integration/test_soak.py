"""Lease soak (``pytest -m slow``): flaky owners fight over short leases; the log stays single-writer.

Four worker processes share three runs for ``BATON_SOAK_SECONDS`` (default 60) per backend, on the
real clock, with leases of 50-200 ms, random stalls, renewals and releases (``soak_support.py``).
Afterwards the auditor replays every run (chain, digests, fencing, leases, operations, budgets) and
the verdicts are held against the store: every accepted submission is stored once, at the position
its verdict named; no rejected one is stored at all.
"""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

import pytest
from integration_support import LedgerFactory, RawStore, open_run, reports_of
from soak_support import soak_worker

from baton.adapters.audit_runner import audit_store
from baton.adapters.clock import SystemClock
from baton.domain.events import LeaseGranted

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SECONDS = float(os.environ.get("BATON_SOAK_SECONDS", "60"))
RUNS = ["soak-0", "soak-1", "soak-2"]
WORKERS = 4


def run_workers(url: str) -> dict[str, list[tuple[dict[str, Any], dict[str, Any]]]]:
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    processes = [
        ctx.Process(target=soak_worker, args=(url, RUNS, f"w{k}", SECONDS, k, results), name=f"w{k}")
        for k in range(WORKERS)
    ]
    logs = {}
    for worker, log, error in reports_of(processes, results, SECONDS + 120):
        assert error is None, f"{worker}: {error}"
        logs[worker] = log
    return logs


def test_flaky_owners_on_short_leases_leave_a_single_writer_log(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given four workers fighting over three runs' short leases, when they stall, renew and release at
    random, then the audit is clean, every accepted submission is stored once where its verdict said,
    and nothing rejected is stored."""
    ledger = ledgers(SystemClock())
    for run in RUNS:
        assert open_run(ledger, run).verdict == "accepted"

    logs = run_workers(store.url)

    report = audit_store(ledger)
    assert report.ok, [str(p) for p in report.problems[:10]]
    assert report.runs_checked == len(RUNS)
    verdicts = [(submission, verdict) for log in logs.values() for submission, verdict in log]
    accepted = {s["submission_id"]: v for s, v in verdicts if v["verdict"] == "accepted"}
    rejected = {s["submission_id"]: v for s, v in verdicts if v["verdict"] == "rejected"}
    stored_ids = store.submission_ids()
    assert accepted.keys() <= stored_ids
    assert not rejected.keys() & stored_ids, "a rejected submission was stored"
    assert not [v for _, v in verdicts if v["verdict"] == "duplicate"], "every submission id was new"
    for run in RUNS:
        history = list(ledger.history(run))
        assert [e.position for e in history] == list(range(1, len(history) + 1))
        last_of = {e.submission_id: e.position for e in history}  # a submission's last event
        mine = {sid: v for sid, v in accepted.items() if v["run_id"] == run}
        assert {sid: v["position"] for sid, v in mine.items()} == {
            sid: pos for sid, pos in last_of.items() if sid in mine
        }
        assert set(last_of) - set(mine) == {f"open-{run}"}, "an event no verdict accounts for"
        grants = [e for e in history if isinstance(e.body, LeaseGranted)]
        assert len(grants) >= 3, f"{run}: the lease moved only {len(grants)} times; the soak tested little"
    reasons = [v["reason"] for v in rejected.values()]
    assert reasons.count("stale_epoch") + reasons.count("lease_expired") >= 1, "no append was ever fenced"
