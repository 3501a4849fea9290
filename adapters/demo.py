"""``baton demo``: a scripted coding-agent run that moves between workers mid-flight.

It shows the product's rule end to end: worker A works up to VERIFIED and goes silent; its lease
expires on the store's clock; worker B takes epoch 2; A wakes and its append is refused
(``stale_epoch``) with nothing stored; B reads the log and carries the run to COMMITTED.

On a new store the identities are signed: the demo opens the store's registry with an operator key
of its own and registers both workers, keeping the keys in ``.baton-demo/`` beside the store's
default file; every submission is signed, and one forged under worker-b's name with worker-a's key
is refused. A store that already has unsigned runs stays unsigned ("identities not verified").
"""

from __future__ import annotations

import hashlib
import shlex
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from baton.adapters.bootstrap import init_store, open_ledger, register
from baton.adapters.clock import ManualClock, SystemClock
from baton.adapters.eventstore import RunLedger
from baton.adapters.identity import SigningKey
from baton.domain.canonical import short
from baton.domain.commands import (
    AcquireLease,
    AddPrincipal,
    Command,
    CompleteRun,
    OpenRun,
    RecordIntent,
    RecordObservation,
    RecordTransition,
    ResumeFrom,
    SealCheckpoint,
    Submission,
    Verdict,
)
from baton.domain.decide import context_digest
from baton.domain.errors import BatonError
from baton.domain.events import BlobRef, IntentContext, Placement, RecordedEvent
from baton.domain.identity import REGISTRY_RUN
from baton.domain.stages import Stage

__all__ = ["run_demo"]

Printer = Callable[[str], None]
TOOLS = ("git@2", "editor@1", "pytest@8")
KEYS = Path(".baton-demo")  # the demo's keys, in the working directory
WORKERS = ("worker-a", "worker-b")


def _blob(text: str) -> BlobRef:
    data = text.encode()
    return BlobRef("sha256:" + hashlib.sha256(data).hexdigest(), len(data), "blob://demo/" + text[:16])


class _Timeline:
    """Prints each stored event once, whichever worker's append stored it."""

    def __init__(self, out: Printer) -> None:
        self.out = out
        self.printed = 0

    def show(self, ledger: RunLedger, run_id: str) -> None:
        for event in ledger.history(run_id, after=self.printed):
            self.out(_line(event))
            self.printed = event.position


class _Worker:
    """One agent worker: submits under its own name and the epoch it believes it holds."""

    def __init__(self, ledger: RunLedger, run_id: str, name: str, timeline: _Timeline, key: SigningKey | None) -> None:
        self.ledger, self.run_id, self.name, self.timeline, self.key = ledger, run_id, name, timeline, key
        self.out = timeline.out
        self.epoch = 0
        self.count = 0

    def submit(self, command: Command) -> Verdict:
        self.count += 1
        submission = Submission(f"{self.run_id}/{self.name}/{self.count}", self.run_id, self.name, command, self.epoch)
        verdict = self.ledger.submit(self.key.sign(submission) if self.key is not None else submission)
        if verdict.verdict == "rejected":
            self.out(f"   x  {self.name} {type(command).__name__} REJECTED: {verdict.reason} ({verdict.message})")
        else:
            self.timeline.show(self.ledger, self.run_id)
        return verdict

    def acquire(self, **placement: Any) -> None:
        verdict = self.submit(AcquireLease(Placement(self.name, tool_contracts=TOOLS, **placement), ttl_ms=30_000))
        self.epoch = self.ledger.state(self.run_id).epoch if verdict.verdict != "rejected" else self.epoch

    def step(self, op_id: str, kind: str, tool: str, operation: str, args: dict[str, Any], result: Any) -> None:
        context = IntentContext(turn=self.count, operation=operation, arguments=args)
        self.submit(RecordIntent(op_id, kind, tool, context, idempotency_key=f"{self.run_id}:{op_id}"))  # type: ignore[arg-type]
        self.submit(RecordObservation(op_id, context_digest(context), "ok", result=result))

    def replayed(self) -> None:
        """Say the prefix was replayed (``resume_from``): a worker that took the run over must, first."""
        run = self.ledger.state(self.run_id)
        self.submit(ResumeFrom(run.prefix_position, run.prefix_digest))

    def move(self, stage: Stage) -> Verdict:
        return self.submit(RecordTransition(stage, state_digest=_blob(f"{self.run_id}:{stage}").digest))


def _line(event: RecordedEvent) -> str:
    detail = ""
    body: Any = event.body
    if hasattr(body, "to_stage"):
        detail = f"{body.from_stage} -> {body.to_stage}"
    elif hasattr(body, "op_id"):
        detail = body.op_id
    elif hasattr(body, "checkpoint_id"):
        detail = body.checkpoint_id
    elif hasattr(body, "prefix_digest"):
        detail = f"replayed to {body.position}"
    return f"{event.position:>4}  {event.type:<20} {event.worker:<10} {event.epoch:>5}  {short(event.digest)}  {detail}"


def _identities(url: str) -> dict[str, SigningKey] | None:
    """The workers' keys in a store that verifies identities (opening its registry on a new store),
    or None for a store that accepts unsigned submissions."""
    ledger = open_ledger(url, one_shot=True)
    try:
        registry, has_runs = ledger.state(REGISTRY_RUN), bool(ledger.runs())
    finally:
        ledger.close()
    operator_file = KEYS / "operator.key"
    if not registry.opened and not has_runs:
        KEYS.mkdir(mode=0o700, exist_ok=True)
        operator = SigningKey.read(operator_file) if operator_file.exists() else SigningKey.generate()
        if not operator_file.exists():
            operator.write(operator_file)
        init_store(url, operator_key=operator, operator="demo-operator")
    elif not registry.signatures_required:
        return None
    if not operator_file.exists():
        raise BatonError(f"this store verifies identities, and the demo's operator key is not in {KEYS}/")
    operator = SigningKey.read(operator_file)
    keys: dict[str, SigningKey] = {}
    for name in WORKERS:
        path = KEYS / f"{name}.key"
        if path.exists():
            keys[name] = SigningKey.read(path)
            continue
        keys[name] = SigningKey.generate()
        verdict = register(url, operator, AddPrincipal(name, ("worker",), keys[name].public_key))
        if verdict.verdict == "rejected":
            raise BatonError(f"could not register {name}: {verdict.reason}: {verdict.message}")
        keys[name].write(path)
    return keys


def _work_until_verified(a: _Worker) -> None:
    a.submit(OpenRun("coder@2026.11", "coding-agent-state", 1, _blob("Fix the flaky retry test in ledger.py")))
    a.acquire(model="model-large", provider="provider-1", region="eu-west")
    a.step("op-1", "pure", "git@2", "checkout", {"commit": "a41c9e0"}, {"tree": "ok"})
    a.step("op-2", "effect", "editor@1", "apply_patch", {"patch": _blob("patch P").digest}, {"files": 2})
    a.move(Stage.CANDIDATE_READY)
    a.submit(SealCheckpoint("ckpt-1", state_digest=_blob("candidate").digest))
    a.move(Stage.VERIFYING)
    a.step("op-3", "pure", "pytest@8", "run_tests", {"suite": "tests/"}, {"passed": 42, "failed": 0})
    a.move(Stage.VERIFIED)
    a.submit(SealCheckpoint("ckpt-2", state_digest=_blob("verified").digest))


def _forgery(b: _Worker, stolen: SigningKey) -> Verdict:
    """A submission under worker-b's name at its epoch, signed with another principal's key."""
    b.out("   .. someone with worker-a's key submits as worker-b")
    forger = _Worker(b.ledger, b.run_id, b.name, b.timeline, stolen)
    forger.epoch, forger.count = b.epoch, 1000
    verdict = forger.move(Stage.AWAITING_AUTHORITY)
    b.out("")
    return verdict


def run_demo(store: str | None, out: Printer = print) -> int:
    """Run the scripted handover and print its timeline; returns the process exit code."""
    settings = init_store(store)
    keys = _identities(settings.url)
    clock = ManualClock(start=SystemClock().now())
    run_id = "demo-" + uuid.uuid4().hex[:8]
    ledger_a = open_ledger(settings.url, clock=clock)  # worker A's process
    ledger_b = open_ledger(settings.url, clock=clock)  # worker B's process, same store and clock
    timeline = _Timeline(out)
    a = _Worker(ledger_a, run_id, "worker-a", timeline, keys["worker-a"] if keys else None)
    b = _Worker(ledger_b, run_id, "worker-b", timeline, keys["worker-b"] if keys else None)
    out(f"baton demo: run {run_id} on {settings.url}")
    if keys:
        out(f"identities verified: every submission is signed (keys in {KEYS}/)\n")
    else:
        out("identities not verified: this store accepts unsigned submissions\n")
    out(f"{'pos':>4}  {'event':<20} {'worker':<10} {'epoch':>5}  {'digest':<12}  detail")
    _work_until_verified(a)

    out("\n   .. worker-a goes silent; 45 s pass on the store's clock; its 30 s lease expires")
    clock.advance(seconds=45)
    b.acquire(model="model-small", provider="provider-2", region="us-east")
    before = len(list(ledger_a.history(run_id)))
    out("\n   .. worker-a wakes up and tries to carry on at epoch 1")
    stale = a.move(Stage.AWAITING_AUTHORITY)
    after = len(list(ledger_a.history(run_id)))
    out(f"   .. events before {before}, after {after}: nothing stored\n")

    forged = _forgery(b, keys["worker-a"]) if keys else None

    out("   .. worker-b reads the log, verifies the chain, replays the prefix and continues")
    ledger_b.verify(run_id)
    b.replayed()
    for stage in (Stage.AWAITING_AUTHORITY, Stage.AUTHORIZED, Stage.COMMITTING):
        b.move(stage)
    b.step("op-4", "effect", "git@2", "push", {"branch": "fix/flaky-retry"}, {"pushed": "b7d2f11"})
    b.move(Stage.COMMITTED)
    b.submit(CompleteRun("patch committed once by worker-b"))

    report = ledger_b.verify(run_id)
    state = ledger_b.state(run_id)
    forged_ok = forged is None or forged.reason == "principal_mismatch"
    ok = stale.reason == "stale_epoch" and before == after and state.stage is Stage.COMMITTED and forged_ok
    out(
        f"\nsummary: run {run_id} {state.status} at {state.stage}, {report.events} events, chain verified "
        f"(head {short(report.head_digest)}), epoch {state.epoch}; stale append by worker-a: "
        f"{stale.reason}, events {before} -> {after}"
        + (f"; forged submission: {forged.reason}" if forged is not None else "")
    )
    flag = f" --store {shlex.quote(store)}" if store else ""  # pasteable: ? and & in a URL are shell syntax
    out("\ninspect it:")
    out(f"  baton runs{flag}")
    out(f"  baton history {run_id}{flag}")
    out(f"  baton history {run_id} --json{flag}")
    out(f"  baton verify {run_id}{flag}")
    for ledger in (ledger_a, ledger_b):
        ledger.close()
    return 0 if ok else 1
