"""The coding-agent story, end to end on real stores (SQLite and the embedded PostgreSQL).

Worker w1 reads commit A, writes patch P, runs the tests in workspace W; the verifier ci records
evidence V and the approver alice approves exactly hash(P); w1 is lost before committing. Worker w2
takes the lease, replays what was recorded without calling the outside world, needs fresh authority
of its own, and commits P exactly once. w1's late commit is refused, and committing anything but P
is refused. Every principal is registered and signs: the store verifies identities, and the audit
checks every signature.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from baton.adapters import handoff
from baton.adapters.audit_runner import audit_store
from baton.adapters.bootstrap import init_store, open_ledger, register
from baton.adapters.clock import ManualClock
from baton.adapters.eventstore import RunLedger
from baton.adapters.identity import SigningKey
from baton.domain.commands import (
    AcquireLease,
    AddPrincipal,
    GrantApproval,
    GrantAuthority,
    OpenRun,
    RecordEvidence,
    RecordIntent,
    RecordObservation,
    RecordTransition,
    ResumeFrom,
    SealCheckpoint,
    Submission,
    Verdict,
)
from baton.domain.decide import context_digest
from baton.domain.events import BlobRef, IntentContext, Placement, Role
from baton.domain.stages import Stage
from baton.projections.audit import audit_events
from baton.projections.resumability import ResumabilityClass, RunSummary, classify, resume_point, summary_of

RUN = "fix-flaky-retry"
P = "sha256:" + "aa" * 32  # hash of the patch
W = "sha256:" + "bb" * 32  # the workspace snapshot the tests ran in
TOOLS = ("git@1", "editor@1", "pytest@1")


class Host:
    """The outside world: it counts every call, so "exactly once" is checkable."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def call(self, op_id: str) -> dict[str, Any]:
        self.calls.append(op_id)
        return {"commit": "A"} if op_id == "read" else {"ok": op_id}


PRINCIPALS: dict[str, tuple[Role, ...]] = {
    "w1": ("worker",),
    "w2": ("worker",),
    "alice": ("approver",),
    "ci": ("verifier",),
}
KEYS: dict[str, SigningKey] = {}


@pytest.fixture(params=["sqlite", "postgres"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunLedger]:
    url = f"sqlite:///{tmp_path / 'story.db'}" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    KEYS["operator"] = SigningKey.generate()
    init_store(url, operator_key=KEYS["operator"])
    for name, roles in PRINCIPALS.items():
        KEYS[name] = SigningKey.generate()
        assert register(url, KEYS["operator"], AddPrincipal(name, roles, KEYS[name].public_key)).verdict == "accepted"
    # the story's clock starts after the registry's events, which the store's own clock stamped
    opened = open_ledger(url, clock=ManualClock(time.time_ns() // 1000 + 1_000_000))
    yield opened
    opened.close()


class Worker:
    def __init__(self, ledger: RunLedger, name: str, host: Host) -> None:
        self.ledger, self.name, self.host, self.n = ledger, name, host, 0
        self.epoch = 0

    def submit(self, command: Any, *, epoch: int | None = None) -> Verdict:
        self.n += 1
        submission = Submission(
            f"{self.name}-{self.n}", RUN, self.name, command, self.epoch if epoch is None else epoch
        )
        return self.ledger.submit(KEYS[self.name].sign(submission))

    def ok(self, command: Any) -> Verdict:
        verdict = self.submit(command)
        assert verdict.verdict == "accepted", verdict
        return verdict

    def lease(self) -> None:
        self.ok(AcquireLease(Placement(self.name, model="m", tool_contracts=TOOLS), ttl_ms=60_000))
        self.epoch = self.ledger.state(RUN).epoch

    def effect(self, op_id: str, tool: str, context: IntentContext) -> None:
        """Intent, gate, host call, observation: the only way this worker touches the world."""
        self.ok(RecordIntent(op_id, "effect", tool, context, f"idem-{op_id}"))
        assert handoff.gate(self.ledger, RUN, self.name, self.epoch, op_id).allowed
        result = self.host.call(op_id)
        self.ok(RecordObservation(op_id, context_digest(context), "ok", result=result))

    def move(self, *stages: Stage) -> None:
        for stage in stages:
            self.ok(RecordTransition(stage, f"sha256:{stage.lower()}"))


def commit_context(proposal: str, grant: str) -> IntentContext:
    return IntentContext(5, "git_push", effect="write", authorization=grant, state_digest=W, proposal_digest=proposal)


def verified_and_approved(holder: Worker, verifier: Worker, approver: Worker) -> None:
    """Evidence from the verifier and an approval for exactly P; the holder can vouch for neither."""
    own = holder.submit(RecordEvidence("V", P, W, "rel-1", "pass"))
    assert (own.verdict, own.reason) == ("rejected", "role_not_allowed")
    verifier.ok(RecordEvidence("V", P, W, "rel-1", "pass"))
    holder.move(Stage.VERIFIED, Stage.AWAITING_AUTHORITY)
    approver.ok(GrantApproval("approval-1", P))


def replayed(ledger: RunLedger, w2: Worker, summary: RunSummary) -> None:
    """w2 replays the prefix (each recorded outcome comes back without calling the host), then says so."""
    cursor = ledger.replay_cursor(RUN, summary.prefix)
    for op_id, tool, context in [
        ("patch", "editor@1", IntentContext(2, "write_patch", effect="write", proposal_digest="")),
        ("tests", "pytest@1", IntentContext(3, "run_tests", effect="read", state_digest=W)),
    ]:
        step = cursor.offer(op_id, "effect", tool, context)
        assert step is not None and step.result == {"ok": op_id}
    cursor.require_new_effects_allowed()
    point = resume_point(summary.state, "w2")  # what resume printed before w2 took the lease
    w2.ok(ResumeFrom(point.position, point.prefix_digest))


def test_the_replacement_commits_exactly_once_and_nothing_else_moves(ledger: RunLedger) -> None:
    """Given w1 lost before its approved commit, when w2 resumes, then P is committed once, by w2, with
    w2's own authority; w1's late commit and a commit of P' are refused and store nothing."""
    host, operator, approver = Host(), Worker(ledger, "operator", Host()), Worker(ledger, "alice", Host())
    verifier = Worker(ledger, "ci", Host())
    w1, w2 = Worker(ledger, "w1", host), Worker(ledger, "w2", host)
    w1.ok(OpenRun("rel-1", "coding-agent", 1, BlobRef("sha256:" + "cc" * 32, 10)))
    w1.lease()
    operator.ok(GrantAuthority("g1", "cap://git/repo#push", "w1", w1.epoch))
    w1.effect("read", "git@1", IntentContext(1, "git_show", effect="read", arguments={"rev": "A"}))
    w1.move(Stage.CANDIDATE_READY)
    w1.ok(SealCheckpoint("ckpt-candidate", "sha256:candidate"))
    w1.effect("patch", "editor@1", IntentContext(2, "write_patch", effect="write", proposal_digest=""))
    w1.move(Stage.VERIFYING)
    w1.effect("tests", "pytest@1", IntentContext(3, "run_tests", effect="read", state_digest=W))
    verified_and_approved(w1, verifier, approver)
    w1.move(Stage.AUTHORIZED)
    calls_before_loss = list(host.calls)

    ledger.clock.advance(seconds=61)  # type: ignore[attr-defined]  # w1 is lost: its lease runs out
    summary = summary_of(ledger.resume_fold(RUN))
    target = Placement("w2", model="m", tool_contracts=TOOLS)
    verdict = classify(summary, target, ledger.clock.now())
    assert verdict.cls is ResumabilityClass.R4 and summary.prefix.length == 2  # patch and tests replay
    w2.lease()
    unreplayed = RecordIntent("commit", "effect", "git@1", commit_context(P, "g1"), "idem-commit")
    assert w2.submit(unreplayed).reason == "replay_required"  # the ledger, not the cursor, holds w2 to it
    replayed(ledger, w2, summary)
    assert host.calls == calls_before_loss  # the replay called nothing

    inherited = w2.submit(RecordIntent("commit", "effect", "git@1", commit_context(P, "g1"), "idem-commit"))
    assert (inherited.verdict, inherited.reason) == ("rejected", "authority_missing")  # grants never move
    operator.ok(GrantAuthority("g2", "cap://git/repo#push", "w2", w2.epoch))
    w2.move(Stage.COMMITTING)
    tampered = w2.submit(RecordIntent("commit-p2", "effect", "git@1", commit_context(P[:-2] + "ff", "g2"), "k2"))
    assert (tampered.verdict, tampered.reason) == ("rejected", "approval_mismatch")
    head = ledger.state(RUN).version
    late = w1.submit(RecordIntent("commit", "effect", "git@1", commit_context(P, "g1"), "idem-commit"))
    assert (late.verdict, late.reason, late.current_epoch) == ("rejected", "stale_epoch", 2)
    assert not handoff.gate(ledger, RUN, "w1", 1, "commit").allowed
    assert ledger.state(RUN).version == head  # refusals store nothing

    w2.effect("commit", "git@1", commit_context(P, "g2"))
    w2.move(Stage.COMMITTED)

    assert host.calls.count("commit") == 1
    assert [call for call in host.calls if call != "commit"] == calls_before_loss
    final = ledger.state(RUN)
    assert (final.stage, final.epoch, final.holder) == (Stage.COMMITTED, 2, "w2")
    assert ledger.verify(RUN).events == final.version
    assert audit_events(RUN, list(ledger.history(RUN))) == []  # the auditor finds the whole story lawful
    assert audit_store(ledger).problems == []  # ... and every event signed by its registered author
