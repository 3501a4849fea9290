"""Given a run prepared in store A for store B, when stores A, B and C claim, import, retry and abort in
any order, then at most one store ever holds a valid claim and only that store becomes a live successor.

Three real stores, SQLite and PostgreSQL mixed (the ``stores`` fixture of test_handoff).
"""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from test_handoff import STATE_V1, Worker, claimed, exported, imported, started

from baton.adapters import handoff
from baton.adapters.eventstore import RunLedger
from baton.domain.chain import seal
from baton.domain.commands import AbortHandoff, AcceptHandoff, RenewLease, ReserveStage, Submission
from baton.domain.events import LeaseRenewed
from baton.domain.receipts import ClaimReceipt
from baton.projections.audit import audit_events

_runs = itertools.count()


def test_every_refusal_of_the_protocol_has_its_code_and_stores_nothing(stores: dict[str, RunLedger]) -> None:
    """Given a handoff claimed in A for B, then: C's claim, A's abort and in-store acceptance, the new
    holder's work in A, an import without receipt, into C with B's receipt, with a receipt altered after
    signing and under an untrusted key are each refused with their code, and no store changes."""
    a, b, c = stores["A"], stores["B"], stores["C"]
    started(a, run_id="r-refusals")
    prepared = exported(a, b, "w2", STATE_V1, run_id="r-refusals")
    receipt = claimed(a, prepared, b)
    assert claimed(a, prepared, b) == receipt  # asked again after a lost reply: the same receipt
    heads = {name: store.state("r-refusals").version for name, store in stores.items()}
    w2_in_a = Worker(a, "w2", "r-refusals")
    forged = msgspec.structs.replace(receipt, position=receipt.position + 1)  # its signature no longer covers it
    text = msgspec.json.encode(receipt).decode()

    refusals = {
        "claim for C": handoff.claim(a, "r-refusals", prepared.digest, c.identity().store_id),
        "abort in A": w2_in_a.submit(AbortHandoff("changed my mind")),
        "accept in A": w2_in_a.submit(AcceptHandoff(prepared.document.decode(), prepared.digest)),
        "work in A": w2_in_a.submit(ReserveStage("more", 1)),
        "no receipt": handoff.accept(b, prepared.document, prepared.digest, trust=a.identity().public_key),
        "into C": imported(c, prepared, receipt, a),
        "forged position": imported(b, prepared, forged, a),
        "untrusted key": handoff.accept(
            b, prepared.document, prepared.digest, receipt=text, trust=c.identity().public_key
        ),
    }  # fmt: skip

    assert {name: getattr(answer, "reason", None) for name, answer in refusals.items()} == {
        "claim for C": "already_claimed",
        "abort in A": "already_claimed",
        "accept in A": "already_claimed",
        "work in A": "already_claimed",
        "no receipt": "claim_required",
        "into C": "claim_not_for_this_store",
        "forged position": "bad_signature",
        "untrusted key": "bad_signature",
    }
    assert {name: store.state("r-refusals").version for name, store in stores.items()} == heads
    assert imported(b, prepared, receipt, a).verdict == "accepted"
    assert b.state("r-refusals").holder == "w2"


def test_a_claim_for_another_store_than_the_document_names_is_refused(stores: dict[str, RunLedger]) -> None:
    """Given a document for B, when someone claims it in A for C, then claim_not_for_this_store; B can still claim."""
    a, b, c = stores["A"], stores["B"], stores["C"]
    started(a, run_id="r-other")
    prepared = exported(a, b, "w2", STATE_V1, run_id="r-other")

    refused = handoff.claim(a, "r-other", prepared.digest, c.identity().store_id)

    assert getattr(refused, "reason", None) == "claim_not_for_this_store"
    assert a.state("r-other").claimed_store is None
    assert isinstance(claimed(a, prepared, b), ClaimReceipt)


class OneSuccessor(RuleBasedStateMachine):
    """Claims, imports, retries and aborts of one handoff, in any order, against three real stores."""

    def __init__(self, stores: dict[str, RunLedger]) -> None:
        super().__init__()
        self.stores = stores
        self.run_id = f"r-{next(_runs)}"
        started(stores["A"], run_id=self.run_id)
        self.prepared: Any = exported(stores["A"], stores["B"], "w2", STATE_V1, run_id=self.run_id)
        self.receipts: dict[str, ClaimReceipt] = {}

    @rule(store=st.sampled_from(["B", "C"]))
    def claim(self, store: str) -> None:
        answer = handoff.claim(
            self.stores["A"], self.run_id, self.prepared.digest, self.stores[store].identity().store_id
        )
        if isinstance(answer, ClaimReceipt):
            self.receipts[store] = answer

    @rule(store=st.sampled_from(["B", "C"]), holder=st.sampled_from(["B", "C", None]))
    def import_(self, store: str, holder: str | None) -> None:
        """Import into ``store`` with the receipt ``holder`` got (None: without any)."""
        receipt = self.receipts.get(holder) if holder is not None else None
        if receipt is None:
            handoff.accept(self.stores[store], self.prepared.document, self.prepared.digest)
        else:
            imported(self.stores[store], self.prepared, receipt, self.stores["A"])

    @rule()
    def abort(self) -> None:
        Worker(self.stores["A"], "w2", self.run_id).submit(AbortHandoff("called off"))

    @rule()
    def accept_in_source(self) -> None:
        command = AcceptHandoff(self.prepared.document.decode(), self.prepared.digest)
        ledger = self.stores["A"]
        ledger.submit(Submission(f"in-a-{self.run_id}", self.run_id, "w2", command, ledger.state(self.run_id).epoch))

    @invariant()
    def at_most_one_successor(self) -> None:
        assert len(self.receipts) <= 1, self.receipts  # at most one store ever holds a valid claim
        live = [name for name in ("B", "C") if self.stores[name].state(self.run_id).opened]
        source = self.stores["A"].state(self.run_id)
        if source.handoff_digest == self.prepared.digest:
            live.append("A")
        assert len(live) <= 1, live
        for name in live:  # no store is a live successor without the claim
            assert name in self.receipts, (name, self.receipts)


def test_one_successor_whatever_the_order_of_claims_imports_retries_and_aborts(stores: dict[str, RunLedger]) -> None:
    """Given any sequence of the protocol's steps (hypothesis), then the invariants hold after each."""
    run_state_machine_as_test(
        lambda: OneSuccessor(stores),
        settings=settings(
            max_examples=12, stateful_step_count=6, deadline=None, suppress_health_check=list(HealthCheck)
        ),
    )


def test_the_source_audits_clean_after_a_claim_and_an_event_forged_after_it_is_found(
    stores: dict[str, RunLedger],
) -> None:
    """Given a run claimed in A for B and confirmed, then A's log audits clean; when an event is appended
    after the claim behind the ledger's back (the claim ignored), then the audit says after_claim there."""
    a, b = stores["A"], stores["B"]
    started(a, run_id="r-audit")
    prepared = exported(a, b, "w2", STATE_V1, run_id="r-audit")
    assert imported(b, prepared, claimed(a, prepared, b), a).verdict == "accepted"
    assert handoff.confirm(a, "r-audit", prepared.digest, 1).verdict == "accepted"
    log = list(a.history("r-audit"))
    assert audit_events("r-audit", log) == []
    assert handoff.status(a, "r-audit").said.startswith(f"handed off to {b.identity().store_id}")

    renewed = seal(
        "r-audit", log[-1].position, log[-1].digest, Submission("late", "r-audit", "w2", RenewLease(), log[-1].epoch),
        log[-1].epoch, [LeaseRenewed("w2", log[-1].epoch, log[-1].recorded_at + 1)], log[-1].recorded_at,
    )  # fmt: skip

    assert {(p.position, p.code) for p in audit_events("r-audit", [*log, *renewed])} == {
        (renewed[0].position, "after_claim")
    }
