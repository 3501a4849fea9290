"""Stateful property test of the whole ledger on a real store: random submissions from several
workers through two ledger instances (two "processes" with separate caches) never break
invariants 2-5 of domain.md, whatever the interleaving, retries and clock jumps."""

from __future__ import annotations

import uuid
from pathlib import Path

import msgspec
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from baton.adapters.bootstrap import init_store, open_ledger
from baton.adapters.clock import ManualClock
from baton.adapters.eventstore import RunLedger
from baton.domain.budgets import COUNTERS, Ceilings, Usage
from baton.domain.chain import verify_chain
from baton.domain.commands import (
    AcquireLease,
    Command,
    ExpireLease,
    OpenRun,
    RecordIntent,
    RecordObservation,
    RecordTransition,
    ReleaseLease,
    RenewLease,
    Submission,
    Verdict,
)
from baton.domain.decide import context_digest
from baton.domain.events import BlobRef, IntentContext, LeaseExpired, LeaseGranted, LeaseReleased, Placement, RunOpened
from baton.domain.stages import Stage

WORKERS = ("w1", "w2", "w3")
CEILINGS = Ceilings(calls=4, stages=3)
UNFENCED = (RunOpened, LeaseGranted, LeaseExpired)


class LedgerMachine(RuleBasedStateMachine):
    store_dir: Path

    @initialize()
    def setup(self) -> None:
        self.clock = ManualClock()
        url = f"sqlite:///{self.store_dir / 'props.db'}"
        init_store(url)
        self.ledgers: list[RunLedger] = [open_ledger(url, clock=self.clock), open_ledger(url, clock=self.clock)]
        self.run_id = "run-" + uuid.uuid4().hex[:10]
        self.sent: dict[str, tuple[Submission, Verdict]] = {}
        self.epochs: dict[str, int] = dict.fromkeys(WORKERS, 0)  # what each worker believes it holds
        self.ops: list[tuple[str, str]] = []
        self.counter = 0
        self.last_usage = Usage()
        self._send(0, "w1", OpenRun("rel", "agent", 1, BlobRef("sha256:00", 1), CEILINGS), epoch=0)

    def teardown(self) -> None:
        for ledger in getattr(self, "ledgers", []):
            ledger.close()

    def _send(self, ledger: int, worker: str, command: Command, epoch: int | None = None) -> Verdict:
        self.counter += 1
        sid = f"{self.run_id}-{self.counter}"
        submission = Submission(sid, self.run_id, worker, command, self.epochs[worker] if epoch is None else epoch)
        verdict = self.ledgers[ledger].submit(submission)
        self.sent[sid] = (submission, verdict)
        return verdict

    @rule(
        kind=st.sampled_from(["fenced"] * 8 + ["acquire"] * 2 + ["time", "time", "expire", "open"]),
        ledger=st.integers(0, 1),
        worker=st.sampled_from(WORKERS),
        lag=st.sampled_from([0, 0, 0, 1]),
        as_holder=st.booleans(),
        choice=st.integers(0, 4),
        ms=st.sampled_from([500, 2_000, 40_000]),
    )
    def act(self, kind: str, ledger: int, worker: str, lag: int, as_holder: bool, choice: int, ms: int) -> None:
        if kind == "open":
            self._send(ledger, worker, OpenRun("rel", "agent", 1, BlobRef("sha256:00", 1), CEILINGS), epoch=0)
        elif kind == "acquire":
            verdict = self._send(ledger, worker, AcquireLease(Placement(worker), ttl_ms=ms), epoch=0)
            if verdict.verdict == "accepted":
                self.epochs[worker] = self.ledgers[ledger].state(self.run_id).epoch
        elif kind == "time":
            self.clock.advance(ms=ms)
        elif kind == "expire":
            self._send(ledger, worker, ExpireLease(), epoch=0)
        else:
            holder = self.ledgers[ledger].state(self.run_id).holder
            worker = holder if as_holder and holder else worker
            self._fenced(ledger, worker, max(0, self.epochs[worker] - lag), choice)

    def _fenced(self, ledger: int, worker: str, epoch: int, choice: int) -> None:
        if choice == 0:
            self._send(ledger, worker, RenewLease(ttl_ms=30_000), epoch)
        elif choice == 1 or not self.ops:
            op_id = f"op-{self.counter}"
            context = IntentContext(turn=self.counter, operation="tool", arguments={"n": self.counter})
            verdict = self._send(ledger, worker, RecordIntent(op_id, "effect", "tool@1", context, op_id), epoch)
            if verdict.verdict == "accepted":
                self.ops.append((op_id, context_digest(context)))
        elif choice == 2:
            op_id, digest = self.ops[self.counter % len(self.ops)]
            self._send(ledger, worker, RecordObservation(op_id, digest, "ok", usage=Usage(fuel=5)), epoch)
        elif choice == 3:
            stage = list(Stage)[(self.counter * 7) % len(Stage)]
            self._send(ledger, worker, RecordTransition(stage, state_digest="sha256:11"), epoch)
        else:
            self._send(ledger, worker, ReleaseLease(), epoch)

    @rule(data=st.data(), ledger=st.integers(0, 1))
    def retry_same(self, data: st.DataObject, ledger: int) -> None:
        """Invariant 4: a retry of an accepted submission returns the original verdict and position."""
        accepted = sorted(sid for sid, (_, v) in self.sent.items() if v.verdict == "accepted")
        if not accepted:
            return
        submission, original = self.sent[data.draw(st.sampled_from(accepted))]
        again = self.ledgers[ledger].submit(submission)
        assert (again.verdict, again.position) == ("duplicate", original.position)

    @rule(data=st.data(), ledger=st.integers(0, 1))
    def reuse_id_for_other_content(self, data: st.DataObject, ledger: int) -> None:
        """Invariant 4: the same id with different content is a conflict and stores nothing."""
        accepted = sorted(sid for sid, (_, v) in self.sent.items() if v.verdict == "accepted")
        if not accepted:
            return
        submission, _ = self.sent[data.draw(st.sampled_from(accepted))]
        before = self.ledgers[0].runs()
        other = msgspec.structs.replace(submission, worker=submission.worker + "-x")
        verdict = self.ledgers[ledger].submit(other)
        assert (verdict.verdict, verdict.reason) == ("rejected", "submission_conflict")
        assert self.ledgers[0].runs() == before

    @invariant()
    def log_obeys_the_invariants(self) -> None:
        if not hasattr(self, "ledgers"):
            return
        ledger = self.ledgers[0]
        stored = [s.state for s in ledger.stored(self.run_id)]
        assert verify_chain(stored, run_id=self.run_id).events == len(stored)  # contiguous and chained
        accepted_positions = {v.position for _, v in self.sent.values() if v.verdict == "accepted"}
        assert max(accepted_positions, default=0) == len(stored)  # rejections stored nothing
        holder: str | None = None
        epoch = 0
        usage = Usage()
        for event in ledger.history(self.run_id):
            body = event.body
            if isinstance(body, LeaseGranted):
                assert body.epoch == epoch + 1  # invariant 3: epochs strictly increase
                epoch, holder = body.epoch, body.worker
                assert event.epoch == epoch
            elif isinstance(body, LeaseExpired):
                holder = None
            elif not isinstance(body, UNFENCED):
                # invariant 2: only the holder of the current epoch appends fenced events
                assert (event.worker, event.epoch) == (holder, epoch), event
                if isinstance(body, LeaseReleased):
                    holder = None
            charge = getattr(body, "charge", None)
            if charge is not None:
                usage = usage.plus(charge)
        for name in COUNTERS:  # invariant 5: never decreases, never passes a ceiling
            assert getattr(usage, name) >= getattr(self.last_usage, name)
            ceiling = getattr(CEILINGS, name)
            assert ceiling is None or getattr(usage, name) <= ceiling
        self.last_usage = usage


def test_random_submissions_never_break_the_invariants(tmp_path: Path) -> None:
    """Given two ledgers on one SQLite store, when hypothesis drives random submissions, retries, id reuse
    and clock jumps from three workers, then the stored log always satisfies invariants 2-5."""
    LedgerMachine.store_dir = tmp_path
    test_case = LedgerMachine.TestCase
    test_case.settings = settings(
        max_examples=30,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    test_case().runTest()
