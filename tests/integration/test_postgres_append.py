"""PostgreSQL's set-based ``baton_append``: a store made before it gets it in place."""

from __future__ import annotations

import pytest
from integration_support import LedgerFactory, RawStore, Submitter, intent, open_run

from adapters.eventstore import RunLedger

pytestmark = pytest.mark.parametrize("store_url", ["postgres"], indirect=True)

RUNS = [f"run-{k}" for k in range(6)]


def leased_runs(ledger: RunLedger, worker: str = "A") -> dict[str, Submitter]:
    """Given the runs of ``RUNS``, open, each leased by ``worker`` at epoch 1."""
    submitters = {}
    for run_id in RUNS:
        assert open_run(ledger, run_id).verdict == "accepted"
        submitters[run_id] = Submitter(ledger, run_id, worker, prefix=f"{worker}-{run_id}")
        assert submitters[run_id].acquire(ttl_ms=600_000).verdict == "accepted"
    return submitters


def test_a_store_without_this_baton_append_gets_it_at_the_first_batch(ledgers: LedgerFactory, store: RawStore) -> None:
    """Given a store whose baton_append predates this version (dropped here), when a batch is
    submitted, then the function is created in place and the batch is accepted in one append."""
    ledger = ledgers()
    workers = leased_runs(ledger)
    store.execute("DROP FUNCTION baton_append(json, json, json, json, bytea[])")

    verdicts = ledger.submit_many([w.submission(intent(f"op-{run_id}")) for run_id, w in workers.items()])

    assert [v.verdict for v in verdicts] == ["accepted"] * len(RUNS)
    assert store.query("SELECT count(*) FROM pg_proc WHERE proname = 'baton_append'") == [(1,)]
    for run_id in RUNS:
        assert store.event_count(run_id) == 3
        ledger.verify(run_id)
