"""Given a run at a sealed boundary, when it is handed off (in one store or across stores), then the
lease, the document, the budgets and the schema move exactly once, and nothing else moves.

Every store here is real: SQLite files and the session's embedded PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from baton.adapters import handoff
from baton.adapters.bootstrap import init_store, open_ledger
from baton.adapters.clock import ManualClock
from baton.adapters.eventstore import RunLedger
from baton.domain.budgets import Ceilings, Usage
from baton.domain.commands import (
    AcceptHandoff,
    AcquireLease,
    OpenRun,
    RecordIntent,
    RecordObservation,
    RecordTransition,
    ReserveStage,
    ResumeFrom,
    SealCheckpoint,
    Submission,
    Verdict,
)
from baton.domain.decide import context_digest
from baton.domain.events import BlobRef, HandoffAccepted, HandoffPrepared, IntentContext, LeaseGranted, Placement
from baton.domain.handoff_document import decode_document, document_digest, encode_document, state_digest_of
from baton.domain.receipts import ClaimReceipt
from baton.domain.stages import Stage
from baton.projections.audit import audit_events

RUN = "run-handoff"
NONCANONICAL = "noncanonical_document"
STATE_V1: dict[str, Any] = {"goal": "fix the flaky retry", "candidates": [{"patch": "p1", "verdict": "rejected"}]}


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[RunLedger]:
    url = f"sqlite:///{tmp_path / 'one.db'}"
    init_store(url)
    opened = open_ledger(url, clock=ManualClock())
    yield opened
    opened.close()


class Worker:
    """A worker appending to one run through one ledger, numbering its submissions."""

    def __init__(self, ledger: RunLedger, name: str, run_id: str = RUN) -> None:
        self.ledger, self.name, self.run_id, self.n = ledger, name, run_id, 0

    def submit(self, command: Any) -> Verdict:
        self.n += 1
        epoch = self.ledger.state(self.run_id).epoch
        sid = f"{self.run_id}/{self.name}-{self.n}"
        return self.ledger.submit(Submission(sid, self.run_id, self.name, command, epoch))

    def ok(self, command: Any) -> Verdict:
        verdict = self.submit(command)
        assert verdict.verdict == "accepted", verdict
        return verdict

    def replayed(self) -> Verdict:
        """Say the prefix the lease's move froze was replayed (``resume_from``), as a new holder must."""
        run = self.ledger.state(self.run_id)
        return self.ok(ResumeFrom(run.prefix_position, run.prefix_digest))

    def work(self, op_id: str, state: dict[str, Any]) -> None:
        """One observed operation and one stage, then a checkpoint sealing ``state`` (after replaying
        the prefix, if the lease came to this worker from another)."""
        if self.ledger.state(self.run_id).replay_required:
            self.replayed()
        context = IntentContext(1, "run_tests", effect="read", arguments={"op": op_id})
        self.ok(ReserveStage(f"stage-{op_id}", 3))
        self.ok(RecordIntent(op_id, "effect", "shell@1", context, f"idem-{op_id}"))
        self.ok(RecordObservation(op_id, context_digest(context), "ok", result={"passed": True}))
        stage = self.ledger.state(self.run_id).stage
        target = Stage.CANDIDATE_READY if stage is Stage.GENERATING else Stage.GENERATING
        self.ok(RecordTransition(target, state_digest_of(state)))
        self.ok(SealCheckpoint(f"ckpt-{op_id}", state_digest_of(state)))


def started(ledger: RunLedger, ceilings: Ceilings | None = None, run_id: str = RUN) -> Worker:
    source = Worker(ledger, "w1", run_id)
    task = BlobRef(state_digest_of(STATE_V1), 64, "blob://task")
    source.ok(OpenRun("rel-1", "coding-agent", 1, task, ceilings or Ceilings()))
    source.ok(AcquireLease(Placement("w1", model="m1", tool_contracts=("shell@1",))))
    source.work("op-1", STATE_V1)
    return source


def to(worker: str) -> Placement:
    return Placement(worker, model="m2", tool_contracts=("shell@1",))


def exported(
    source: RunLedger, destination: RunLedger, worker: str, state: dict[str, Any], run_id: str = RUN, **options: Any
) -> Any:
    """The source's holder prepares a handoff of ``run_id`` to ``worker`` in the ``destination`` store."""
    to_store = destination.identity().store_id
    return handoff.prepare(source, run_id, destination=to(worker), state=state, to_store=to_store, **options)


def claimed(source: RunLedger, prepared: Any, destination: RunLedger) -> ClaimReceipt:
    """The destination claims the prepared handoff in the source and gets the signed receipt."""
    run_id = decode_document(prepared.document).run_id
    receipt = handoff.claim(source, run_id, prepared.digest, destination.identity().store_id)
    assert isinstance(receipt, ClaimReceipt), receipt
    return receipt


def imported(destination: RunLedger, prepared: Any, receipt: ClaimReceipt, source: RunLedger) -> Verdict:
    """The destination imports the document with the receipt, trusting the source store's key."""
    text = msgspec.json.encode(receipt).decode()
    trust = source.identity().public_key
    return handoff.accept(destination, prepared.document, prepared.digest, receipt=text, trust=trust)


def moved(source: RunLedger, destination: RunLedger, worker: str, state: dict[str, Any], **options: Any) -> Any:
    """Export, claim and import: the run moves from ``source`` to ``destination`` (the import's
    verdict is checked by the caller); returns the prepared handoff and the import's verdict."""
    prepared = exported(source, destination, worker, state, **options)
    assert prepared.verdict.verdict == "accepted", prepared.verdict
    return prepared, imported(destination, prepared, claimed(source, prepared, destination), source)


def test_in_store_handoff_moves_the_lease_fences_the_source_and_binds_the_document(ledger: RunLedger) -> None:
    """Prepare records the digest and grants the destination the next epoch in one append; the
    destination accepts exactly that digest before any work; the source's late append is stale."""
    source = started(ledger)

    prepared = handoff.prepare(ledger, RUN, destination=to("w2"), state=STATE_V1, to_version=2)

    assert prepared.verdict.verdict == "accepted"
    head = list(ledger.history(RUN))[-2:]
    assert [type(e.body) for e in head] == [HandoffPrepared, LeaseGranted]
    assert {e.epoch for e in head} == {1}  # the source wrote both, at its own epoch
    assert ledger.state(RUN).epoch == 2 and ledger.state(RUN).holder == "w2"
    late = source.submit(ReserveStage("late", 1))
    assert (late.verdict, late.reason, late.current_epoch) == ("rejected", "stale_epoch", 2)

    destination = Worker(ledger, "w2")
    assert destination.submit(ReserveStage("early", 1)).reason == "handoff_pending"
    wrong = AcceptHandoff(prepared.document.decode(), "sha256:" + "0" * 64)
    assert destination.submit(wrong).reason == "digest_mismatch"
    before = ledger.state(RUN).version

    accepted = handoff.accept(ledger, prepared.document, prepared.digest)

    assert accepted.verdict == "accepted"
    assert ledger.state(RUN).version == before + 1
    [event] = list(ledger.history(RUN, after=before))
    assert isinstance(event.body, HandoffAccepted) and event.body.document_digest == prepared.digest
    state = ledger.state(RUN)
    assert (state.schema_version, state.handoff_digest, state.pending_handoff) == (2, prepared.digest, None)
    again = destination.submit(AcceptHandoff(prepared.document.decode(), prepared.digest))
    assert again.reason == "successor_exists"  # one predecessor, one successor
    destination.work("op-2", decode_document(prepared.document).state)
    assert ledger.verify(RUN).events == ledger.state(RUN).version
    assert audit_events(RUN, list(ledger.history(RUN))) == []  # the source's lease move is no overlap


def test_every_lost_acknowledgement_is_resolved_by_reading_the_store(ledger: RunLedger) -> None:
    """Repeating prepare, accept and the first destination append after a lost reply changes nothing:
    the store answers with the original positions and there is exactly one successor."""
    started(ledger)
    prepared = handoff.prepare(ledger, RUN, destination=to("w2"), state=STATE_V1)
    assert handoff.status(ledger, RUN).pending == prepared.digest  # recovery reads the store

    replayed = handoff.submit_prepare(ledger, prepared.document)  # the source never heard the verdict
    assert (replayed.verdict.verdict, replayed.verdict.position) == ("duplicate", prepared.verdict.position)
    first = handoff.accept(ledger, prepared.document, prepared.digest)
    second = handoff.accept(ledger, prepared.document, prepared.digest)
    assert (first.verdict, second.verdict, second.position) == ("accepted", "duplicate", first.position)

    Worker(ledger, "w2").replayed()
    context = IntentContext(1, "commit", effect="write")
    intent = Submission("w2-first", RUN, "w2", RecordIntent("op-c", "effect", "git@1", context, "k"), 2)
    assert [ledger.submit(intent).verdict for _ in range(2)] == ["accepted", "duplicate"]
    status = handoff.status(ledger, RUN)
    assert (status.accepted, status.pending, status.holder, status.epoch) == (prepared.digest, None, "w2", 2)


def test_a_run_with_an_uncertain_effect_or_unsealed_work_cannot_move(ledger: RunLedger) -> None:
    """A handoff with an uncertain intent, or with work after the last seal, is refused with its reasons."""
    source = started(ledger)
    context = IntentContext(2, "deploy", effect="write")
    source.ok(RecordIntent("op-x", "effect", "shell@1", context, "idem-x"))

    uncertain = handoff.prepare(ledger, RUN, destination=to("w2"), state=STATE_V1).verdict

    assert (uncertain.verdict, uncertain.reason) == ("rejected", "uncertain_intent")
    assert uncertain.message is not None and "'op-x'" in uncertain.message and "reconcile" in uncertain.message
    source.ok(RecordObservation("op-x", context_digest(context), "ok"))
    unsealed = handoff.prepare(ledger, RUN, destination=to("w2"), state=STATE_V1).verdict
    assert (unsealed.verdict, unsealed.reason) == ("rejected", "handoff_unsafe")
    assert unsealed.message is not None and "seal a checkpoint first" in unsealed.message
    assert ledger.state(RUN).holder == "w1" and ledger.state(RUN).pending_handoff is None


@pytest.mark.parametrize("replay_at_b", [False, True], ids=["B continues", "B replays A's stage first"])
def test_cross_store_chain_carries_cumulative_budgets_and_migrates_once_per_step(
    stores: dict[str, RunLedger], replay_at_b: bool
) -> None:
    """A -> B -> C across three stores with a schema change at each step: every counter is exact,
    each document binds its predecessor, importing twice is idempotent, and a stage B replays is
    reserved (charged) again, never refunded."""
    a, b, c = stores["A"], stores["B"], stores["C"]
    started(a)  # one reservation (3 fuel), one intent + observation, one transition
    doc_ab, into_b = moved(a, b, "w2", STATE_V1, to_version=2)
    assert into_b.verdict == "accepted"
    assert imported(b, doc_ab, claimed(a, doc_ab, b), a).verdict == "duplicate"  # claim and import, retried
    state_v2 = decode_document(doc_ab.document).state
    assert state_v2["attempts"] == 1  # the migration ran at export and its result travelled

    on_b = Worker(b, "w2")
    if replay_at_b:
        on_b.ok(ReserveStage("stage-op-1", 3))  # re-running A's last stage at B reserves its fuel again
    on_b.work("op-2", state_v2)
    doc_bc, into_c = moved(b, c, "w3", state_v2, to_version=3)
    assert decode_document(doc_bc.document).predecessor_digest == doc_ab.digest
    assert into_c.verdict == "accepted"

    at_c = c.state(RUN)
    per_hop = Usage(calls=1, stages=1, reserved_fuel=3, iterations=0)  # a stage counts when reserved
    replayed = Usage(stages=1, reserved_fuel=3) if replay_at_b else Usage()
    assert (at_c.usage.calls, at_c.usage.stages, at_c.usage.reserved_fuel) == (
        2 * per_hop.calls,
        2 * per_hop.stages + replayed.stages,
        2 * per_hop.reserved_fuel + replayed.reserved_fuel,
    )
    assert decode_document(doc_bc.document).usage == at_c.usage  # C reports carried + local, nothing lost
    assert at_c.usage.iterations == 1  # B's transition back to GENERATING is one rework iteration
    assert (at_c.schema_version, at_c.epoch, at_c.holder) == (3, 3, "w3")
    assert decode_document(doc_bc.document).state["rejections"] == 1
    assert c.verify(RUN).events == at_c.version
    for store in (a, b, c):
        assert audit_events(RUN, list(store.history(RUN))) == []  # imports open their run at position 1


def test_a_second_document_for_the_same_predecessor_is_refused(stores: dict[str, RunLedger]) -> None:
    """The destination store already continues the run from one document: another is successor_exists."""
    a, b = stores["A"], stores["B"]
    started(a)
    doc, into_b = moved(a, b, "w2", STATE_V1)
    assert into_b.verdict == "accepted"
    forged = decode_document(doc.document)
    other = msgspec.structs.replace(forged, destination=to("w9"), destination_worker="w9")
    data = encode_document(other)
    before = b.state(RUN).version

    verdict = handoff.accept(b, data, document_digest(data))

    assert (verdict.verdict, verdict.reason) == ("rejected", "successor_exists")
    assert b.state(RUN).version == before


def test_carried_usage_that_exhausts_a_ceiling_is_refused_at_the_destination(stores: dict[str, RunLedger]) -> None:
    """Usage carried in that already reaches a ceiling leaves the destination nothing: refused, nothing stored."""
    a, c = stores["A"], stores["C"]
    started(a, Ceilings(calls=1))
    _, verdict = moved(a, c, "w2", STATE_V1)

    assert (verdict.verdict, verdict.reason) == ("rejected", "prior_usage_exhausts_destination")
    assert not c.state(RUN).opened


def _hostile(data: bytes) -> dict[str, tuple[bytes, str]]:
    """Each hostile variant of a valid document, with the reason its import must be refused for."""
    text = data.decode()
    usage_altered = decode_document(data)
    usage_altered = msgspec.structs.replace(
        usage_altered,
        usage=msgspec.structs.replace(usage_altered.usage, calls=0),
        checkpoint=msgspec.structs.replace(
            usage_altered.checkpoint, usage=msgspec.structs.replace(usage_altered.usage, calls=0)
        ),
    )
    return {
        "extra key": (text.replace('{"ceilings"', '{"backdoor":"1","ceilings"', 1).encode(), NONCANONICAL),
        "duplicate key": (text.replace('{"ceilings"', '{"run_id":"x","ceilings"', 1).encode(), NONCANONICAL),
        "leading zero": (
            text.replace('"source_epoch":"1"', '"source_epoch":"01"', 1).encode(),
            "noncanonical_document",
        ),
        "plus sign": (text.replace('"source_epoch":"1"', '"source_epoch":"+1"', 1).encode(), NONCANONICAL),
        "altered state": (text.replace('"fix the flaky retry"', '"delete prod"', 1).encode(), "inconsistent_document"),
        "truncated": (data[:-40], NONCANONICAL),
        "oversize": (data[:-2] + b" " * (1 << 20) + b"}\n", "document_too_large"),
        "altered usage, re-bound": (encode_document(usage_altered), "digest_mismatch"),
    }


@pytest.mark.parametrize(
    "variant",
    ["extra key", "duplicate key", "leading zero", "plus sign", "altered state", "truncated", "oversize",
     "altered usage, re-bound", "wrong digest"],
)  # fmt: skip
def test_hostile_documents_are_refused_with_their_reason_and_store_nothing(
    stores: dict[str, RunLedger], variant: str
) -> None:
    """A document changed in any way is refused at import with its reason code; the store stays empty."""
    a, c = stores["A"], stores["C"]
    started(a)
    doc = handoff.prepare(a, RUN, destination=to("w2"), state=STATE_V1)
    if variant == "wrong digest":
        data, reason, expected = doc.document, "digest_mismatch", "sha256:" + "e" * 64
    else:
        data, reason = _hostile(doc.document)[variant]
        # the hostile bytes arrive with their own digest (an attacker controls both) unless re-bound
        expected = doc.digest if variant == "altered usage, re-bound" else document_digest(data)
    command = AcceptHandoff(data.decode(errors="replace"), expected)

    verdict = c.submit(Submission(f"import-{variant}", RUN, "w2", command, 2))

    assert (verdict.verdict, verdict.reason) == ("rejected", reason)
    assert not c.state(RUN).opened and c.runs() == []
