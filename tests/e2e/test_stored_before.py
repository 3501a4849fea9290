"""Stores written by an earlier release still verify and audit clean: stored chains outlive code changes.

The fixtures in ``tests/fixtures/written-at-c914c1b`` were written by commit c914c1b (before the
canonical encoder was reduced to its reference definition): ``a.db`` holds the demo run and a run
``r1`` handed off to another store, ``b.db`` that store, and ``r1.export.jsonl`` r1's export. Each
store is upgraded first, as an operator does after installing a new release (``baton store init``).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import msgspec
from test_cli import baton

from baton.adapters.bootstrap import init_store, open_ledger
from baton.domain.commands import RecordIntent, Submission
from baton.domain.events import IntentRecorded

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "written-at-c914c1b"


def copied(tmp_path: Path, name: str) -> str:
    """A copy of the fixture store ``name``, upgraded to this release's schema."""
    shutil.copy(FIXTURES / name, tmp_path / name)
    url = f"sqlite:///{tmp_path / name}"
    init_store(url)
    return url


def test_a_store_written_before_audits_clean_and_every_chain_verifies(tmp_path: Path) -> None:
    """Given the stores written at c914c1b, when audited and verified today, then no problem is found."""
    for name, runs in (("a.db", 2), ("b.db", 1)):
        store = copied(tmp_path, name)
        audit = baton(tmp_path, "audit", "--all", "--store", store)
        listed = [json.loads(line) for line in baton(tmp_path, "runs", "--json", "--store", store).stdout.splitlines()]

        assert audit.returncode == 0, audit.stdout + audit.stderr
        assert audit.stdout.strip().endswith(": ok") and f"audited {runs} runs" in audit.stdout
        assert len(listed) == runs
        for run in listed:
            verified = baton(tmp_path, "verify", run["run_id"], "--store", store)
            assert verified.returncode == 0, verified.stdout + verified.stderr


def test_an_export_written_before_verifies_offline(tmp_path: Path) -> None:
    """Given r1's export written at c914c1b, when verified with no store, then its chain holds."""
    verified = baton(tmp_path, "verify-export", str(FIXTURES / "r1.export.jsonl"))

    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_the_handed_off_run_resumes_in_its_new_store(tmp_path: Path) -> None:
    """Given r1 imported into b.db at c914c1b, when its state is read today, then w2 holds it at epoch 2."""
    state = json.loads(baton(tmp_path, "state", "r1", "--json", "--store", copied(tmp_path, "b.db")).stdout)

    assert (state["owner_epoch"], state["run_id"], state["state_schema_version"]) == (2, "r1", 2)


def test_a_submission_accepted_before_is_still_a_duplicate_when_retried(tmp_path: Path) -> None:
    """Given an intent accepted at c914c1b (its row holds that release's form of the content digest), when
    the same submission is retried today, then duplicate at its position; with other content, a conflict."""
    store = copied(tmp_path, "a.db")
    with sqlite3.connect(store.removeprefix("sqlite:///")) as db:
        (run_id,) = db.execute("SELECT run_id FROM baton_runs WHERE run_id LIKE 'demo-%'").fetchone()
    ledger = open_ledger(store)
    try:
        event = next(e for e in ledger.history(run_id) if isinstance(e.body, IntentRecorded))
        body: IntentRecorded = event.body  # type: ignore[assignment]
        command = RecordIntent(body.op_id, body.kind, body.tool_contract, body.context, body.idempotency_key)
        retried = Submission(event.submission_id, run_id, event.worker, command, event.epoch)
        reused = msgspec.structs.replace(retried, command=msgspec.structs.replace(command, idempotency_key="other"))

        assert (ledger.submit(retried).verdict, ledger.submit(retried).position) == ("duplicate", event.position)
        assert ledger.submit(reused).reason == "submission_conflict"
    finally:
        ledger.close()
