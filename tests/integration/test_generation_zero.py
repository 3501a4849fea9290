"""Generation zero (docs/handoff.md): the destination's log alone is enough to resume an imported run.

Given a run handed from a SQLite source store to a destination store (SQLite and PostgreSQL), when
the destination worker is SIGKILLed right after its import and the source store is deleted, then a
replacement worker takes the lease and resumes from the destination store alone: the migrated
state comes back from the destination's blob store byte for byte, the run's usage is carried +
local, and ``baton budgets`` and the SQL views report that same usage.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from generation_zero_support import import_then_hang
from integration_support import RawStore

from baton.adapters import handoff, handoff_state
from baton.adapters.bootstrap import init_store, open_ledger, open_views
from baton.adapters.cli import main
from baton.adapters.clock import ManualClock, SystemClock
from baton.adapters.eventstore import RunLedger
from baton.adapters.worker import LedgerTransport, Worker
from baton.domain.budgets import COUNTERS
from baton.domain.events import IntentContext, Placement
from baton.domain.handoff_document import decode_document, state_bytes
from baton.domain.receipts import ClaimReceipt
from baton.domain.stages import Stage
from baton.projections.audit import audit_events

RUN = "run-gen0"
STATE_V1: dict[str, Any] = {"goal": "fix the flaky retry", "candidates": [{"patch": "p1", "verdict": "rejected"}]}
STATE_PREFIX = b"baton.task-state.v1\x00"
TTL_S = 30  # the import's default lease
TOOLS = ("shell@1",)


def _context(op_id: str) -> IntentContext:
    return IntentContext(1, "run_tests", effect="read", arguments={"op": op_id})


def sealed_by_w1(ledger: RunLedger) -> None:
    """W1 opens ``RUN``, does one observed operation and seals STATE_V1 at CANDIDATE_READY."""
    with Worker(Placement("w1", tool_contracts=TOOLS), LedgerTransport(ledger), ledger, liveness=False) as w1:
        w1.open_run(RUN, "rel-1", ("coding-agent", 1), STATE_V1)
        w1.acquire(RUN)
        w1.step(RUN, "op-1", "shell@1", _context("op-1"), lambda: {"passed": False})
        w1.transition(RUN, Stage.CANDIDATE_READY, STATE_V1)
        w1.seal(RUN, "ckpt-1", STATE_V1)


@pytest.fixture
def source(tmp_path: Path) -> Iterator[tuple[RunLedger, Path]]:
    """A SQLite source store holding a run sealed at a boundary after one observed operation."""
    path = tmp_path / "source.db"
    init_store(f"sqlite:///{path}")
    ledger = open_ledger(f"sqlite:///{path}", clock=ManualClock())
    sealed_by_w1(ledger)
    yield ledger, path
    ledger.close()


def exported(src: RunLedger, destination_url: str) -> tuple[handoff.PreparedHandoff, str, str]:
    """The source prepares the handoff to the destination store and claims it there: the prepared handoff,
    the receipt's JSON and the source store's key to trust. A refused import stores nothing, state included."""
    with contextlib.closing(open_ledger(destination_url, clock=ManualClock())) as destination:
        store_id = destination.identity().store_id
        prepared = handoff.prepare(
            src, RUN, destination=Placement("w2", tool_contracts=TOOLS), state=STATE_V1, to_version=2,
            to_store=store_id,
        )  # fmt: skip
        assert prepared.verdict.verdict == "accepted", prepared.verdict
        assert handoff_state.handed_over(src, RUN) == prepared.document  # the source's log holds what it handed over
        receipt = handoff.claim(src, RUN, prepared.digest, store_id)
        assert isinstance(receipt, ClaimReceipt), receipt
        receipt_text = msgspec.json.encode(receipt).decode()

        wrong_key = destination.identity().public_key
        document, digest = prepared.document, prepared.digest
        untrusted = handoff.accept(destination, document, digest, receipt=receipt_text, trust=wrong_key)
        assert (untrusted.verdict, untrusted.reason) == ("rejected", "bad_signature")
        assert destination.blobs([decode_document(prepared.document).state_digest]) == {}
    return prepared, receipt_text, src.identity().public_key


def imported_then_killed(url: str, prepared: handoff.PreparedHandoff, receipt: str, trust: str) -> None:
    """A destination worker in its own process imports the run and is SIGKILLed as soon as it says so."""
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    importer = ctx.Process(
        target=import_then_hang, args=(url, prepared.document, prepared.digest, receipt, trust, theirs), daemon=True
    )
    importer.start()
    try:
        assert mine.poll(60), "the destination worker never imported the run"
        assert mine.recv() == ("accepted", 2)  # HandoffAccepted and LeaseGranted: one append
    finally:
        importer.kill()  # SIGKILL: no cleanup, no release; its lease lasts its ttl
        importer.join(10)


def reported_usage(store: RawStore, capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], tuple[int, ...]]:
    """What ``baton budgets --run RUN --json`` prints, and the run's row of the ``budget_usage`` view."""
    capsys.readouterr()
    assert main(["budgets", "--run", RUN, "--json", "--store", store.url]) == 0
    printed: dict[str, Any] = json.loads(capsys.readouterr().out)
    with open_views(store.url) as runner:
        runner.catch_up()
    columns = ", ".join(COUNTERS)
    (row,) = store.query(f"SELECT {columns} FROM budget_usage WHERE dimension = ? AND key = ?", ("run", RUN))
    return printed, row


def test_a_destination_killed_after_its_import_is_replaced_from_the_destination_store_alone(
    store: RawStore, source: tuple[RunLedger, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Given an import whose worker is SIGKILLed at once and a deleted source store, then a replacement resumes
    from the destination's log and blobs: the state is the document's, and usage is carried + local everywhere."""
    src, src_path = source
    prepared, receipt, trust = exported(src, store.url)
    doc = decode_document(prepared.document)
    src.close()
    for leftover in src_path.parent.glob(src_path.name + "*"):  # the database, its WAL and shared memory
        leftover.unlink()

    imported_then_killed(store.url, prepared, receipt, trust)

    after_ttl = ManualClock(SystemClock().now() + (TTL_S + 1) * 1_000_000)
    with contextlib.closing(open_ledger(store.url, clock=after_ttl)) as ledger:
        with Worker(Placement("w3", tool_contracts=TOOLS), LedgerTransport(ledger), ledger, liveness=False) as w3:
            assert w3.accepted_state(RUN) == doc.state
            accepted = handoff_state.accepted_state(ledger, RUN)
            assert accepted.data == state_bytes(doc.state)
            assert "sha256:" + hashlib.sha256(STATE_PREFIX + accepted.data).hexdigest() == doc.state_digest
            assert accepted.event.imported
            migration = (accepted.event.migration_id, accepted.event.from_schema, accepted.event.from_version)
            assert migration == (doc.migration.migration_id, "coding-agent", 1)

            assert w3.acquire(RUN) == doc.source_epoch + 2  # past the killed importer's epoch
            resumed = w3.resume(RUN)
            assert resumed.checkpoint.task_state_digest == doc.state_digest
            assert resumed.checkpoint.state_schema_version == 2
            assert resumed.checkpoint.usage == doc.usage
            state = w3.accepted_state(RUN)
            w3.step(RUN, "op-2", "shell@1", _context("op-2"), lambda: {"passed": True})
            w3.seal(RUN, "ckpt-2", {**state, "attempts": state["attempts"] + 1})
            w3.release(RUN)

        usage = ledger.resume_fold(RUN).run.usage
        assert usage.calls == doc.usage.calls + 1  # carried + local
        assert audit_events(RUN, list(ledger.history(RUN))) == []

    printed, row = reported_usage(store, capsys)
    assert printed == {"run": RUN, **msgspec.to_builtins(usage)}
    assert row == tuple(getattr(usage, name) for name in COUNTERS)


def test_an_in_store_handoff_stores_the_document_with_its_prepare_and_the_state_with_its_acceptance(
    store: RawStore,
) -> None:
    """Given a handoff within one store, then the prepare's append stored the document and the acceptance's
    the migrated state, each under the digest its event names; the budgets count nothing twice."""
    with contextlib.closing(open_ledger(store.url, clock=ManualClock())) as ledger:
        sealed_by_w1(ledger)
        prepared = handoff.prepare(
            ledger, RUN, destination=Placement("w2", tool_contracts=TOOLS), state=STATE_V1, to_version=2
        )
        assert prepared.verdict.verdict == "accepted", prepared.verdict
        assert handoff.accept(ledger, prepared.document, prepared.digest).verdict == "accepted"
        doc = decode_document(prepared.document)

        assert handoff_state.handed_over(ledger, RUN) == prepared.document
        accepted = handoff_state.accepted_state(ledger, RUN)
        assert (accepted.state, accepted.event.imported) == (doc.state, False)
        assert ledger.blobs([prepared.digest, doc.state_digest]) == {
            prepared.digest: prepared.document,
            doc.state_digest: state_bytes(doc.state),
        }
        usage = ledger.resume_fold(RUN).run.usage
    with open_views(store.url) as runner:
        runner.catch_up()
    columns = ", ".join(COUNTERS)
    (row,) = store.query(f"SELECT {columns} FROM budget_usage WHERE dimension = ? AND key = ?", ("run", RUN))
    assert row == tuple(getattr(usage, name) for name in COUNTERS)
