"""The audit of handoffs, authority, approvals and evidence: real histories audit clean, forged ones are named.

Given a history built through ``decide`` (tests/unit/domain/given.py), when it is audited, then
nothing is reported; given the same history with events a rogue writer appended behind ``decide``'s
back, then each is reported with its code at its position.
"""

from __future__ import annotations

from typing import Any

import msgspec

from baton.domain.budgets import Usage
from baton.domain.chain import seal
from baton.domain.commands import (
    AbortHandoff,
    AcceptHandoff,
    DenyApproval,
    GrantApproval,
    GrantAuthority,
    PrepareHandoff,
    RecordEvidence,
    RecordIntent,
    RecordObservation,
    ReleaseLease,
    RevokeAuthority,
    SealCheckpoint,
    Submission,
)
from baton.domain.decide import context_digest
from baton.domain.events import (
    ApprovalGranted,
    AuthorityGranted,
    AuthorityRevoked,
    Event,
    EvidenceRecorded,
    HandoffAborted,
    HandoffAccepted,
    IntentContext,
    IntentRecorded,
    LeaseGranted,
    RecordedEvent,
)
from baton.domain.handoff_document import HandoffDocument, Migration, document_digest, encode_document, state_digest_of
from baton.domain.stages import Stage
from baton.projections.audit import CODES, Problem, audit_events, audit_stored
from baton.projections.portable_state import portable_state

from ..domain.given import RUN, W1, W2, W3, History, given, placement, seconds
from ..domain.handoffs import DESTINATION_STORE, claimed_import

OPERATOR = "operator"
APPROVER = "alice"
VERIFIER = "ci"
STATE: dict[str, Any] = {"goal": "fix the flaky retry", "candidates": []}
P = "sha256:" + "aa" * 32  # the proposal (patch) digest
P2 = "sha256:" + "cc" * 32
WORKSPACE = "sha256:" + "bb" * 32
OTHER = "sha256:" + "ff" * 32  # a digest no handoff here has


def found(problems: list[Problem]) -> set[tuple[int, str]]:
    assert all(p.code in CODES for p in problems), problems
    return {(p.position, p.code) for p in problems}


def audited(log: list[RecordedEvent]) -> set[tuple[int, str]]:
    """The problems of ``log`` audited as envelopes and as stored bytes (they must agree), anchored at its head."""
    anchor = (log[-1].position, log[-1].digest)
    problems = audit_events(RUN, log, anchor)
    assert audit_stored(RUN, [msgspec.json.encode(e) for e in log], anchor) == problems
    return found(problems)


def forge(history: History, *bodies: Event, worker: str = W1, epoch: int | None = None) -> int:
    """Append ``bodies`` as one sealed submission (a valid chain) behind ``decide``'s back; the first position.

    The history's state is not advanced: forge only after the last ``record``.
    """
    last = history.log[-1]
    submission = Submission(f"forged-{last.position}", RUN, worker, ReleaseLease(), 0)
    epoch = history.state.epoch if epoch is None else epoch
    events = seal(RUN, last.position, last.digest, submission, epoch, list(bodies), history.now)
    history.log.extend(events)
    return events[0].position


# -- building real handoffs -----------------------------------------------------------------------


def sealed(run: History | None = None, worker: str = W1) -> History:
    """W1 holds epoch 1 (or ``worker`` continues ``run``), did one operation and sealed the task state:
    a boundary a handoff starts from."""
    history = run or given().opened().leased(W1)
    op_id = f"op-{len(history.log)}"
    history.intended(op_id, kind="pure", worker=worker).observed(op_id, worker=worker)
    history.record(SealCheckpoint(f"ckpt-{op_id}", state_digest_of(STATE)), worker=worker)
    return history


def document(history: History, destination: str, to_store: str | None = None) -> tuple[str, str]:
    """The canonical document handing the run to ``destination`` (in ``to_store``, another store)
    from the log as it is now, and its digest."""
    run = history.state
    assert run.lease is not None
    checkpoint = portable_state(history.log)
    assert checkpoint.task_state_digest == state_digest_of(STATE)
    doc = HandoffDocument(
        run_id=run.run_id,
        checkpoint=checkpoint,
        state_schema_name=run.schema_name,
        state_schema_version=run.schema_version,
        state=STATE,
        state_digest=state_digest_of(STATE),
        usage=run.usage,
        ceilings=run.ceilings,
        migration=Migration.identity(run.schema_name, run.schema_version),
        predecessor_digest=run.handoff_digest,
        source=checkpoint.placement or run.lease.placement,
        destination=placement(destination),
        source_epoch=run.epoch,
        source_worker=run.lease.worker,
        destination_worker=destination,
        destination_store=to_store if to_store is not None else msgspec.UNSET,
    )
    data = encode_document(doc)
    return data.decode(), document_digest(data)


def prepared(history: History, destination: str = W2, *, to_store: str | None = None) -> tuple[str, str]:
    """The holder prepares a handoff to ``destination`` (in ``to_store``): HandoffPrepared + LeaseGranted
    in one append."""
    data, digest = document(history, destination, to_store)
    history.record(PrepareHandoff(data), worker=history.state.holder or "")
    return data, digest


def handed_over() -> History:
    """W1 handed the run to W2 in this store, and W2 accepted it."""
    history = sealed()
    data, digest = prepared(history)
    history.record(AcceptHandoff(data, digest), worker=W2)
    return history


# -- real histories audit clean -------------------------------------------------------------------


def test_an_in_store_handoff_audits_clean() -> None:
    """Given prepare (lease move at the source's epoch), acceptance and the destination's work, then no problem."""
    history = handed_over()
    kinds = [e.type for e in history.log[-3:]]
    assert kinds == ["HandoffPrepared", "LeaseGranted", "HandoffAccepted"]
    assert history.log[-2].epoch == 1 and history.log[-2].worker == W1  # the source wrote the lease move
    history.resumed(W2)
    sealed(history, worker=W2)
    history.moved_to(Stage.CANDIDATE_READY, worker=W2)

    assert audited(history.log) == set()


def test_an_imported_run_and_its_next_handoff_audit_clean() -> None:
    """Given a run imported into another store (its first event) and handed on from there, then no problem."""
    source = sealed()
    data, digest = prepared(source, to_store=DESTINATION_STORE)
    target = given()
    target.record(claimed_import(data, digest, RUN), worker=W2)
    assert [e.type for e in target.log] == ["HandoffAccepted", "LeaseGranted"]
    sealed(target, worker=W2)
    data, digest = prepared(target, W3)
    target.record(AcceptHandoff(data, digest), worker=W3)
    target.resumed(W3).intended("op-3", worker=W3)

    assert audited(source.log) == set()
    assert audited(target.log) == set()


def test_an_aborted_handoff_and_an_acceptance_after_retaking_the_lease_audit_clean() -> None:
    """Given a destination whose lease lapsed before it accepted, when it retakes the lease and accepts,
    or a third worker takes over and aborts, then no problem."""
    late = sealed()
    data, digest = prepared(late)
    late.advance(seconds(31)).leased(W2)
    late.record(AcceptHandoff(data, digest), worker=W2)
    late.resumed(W2)
    assert late.state.epoch == 3

    aborted = sealed()
    prepared(aborted)
    aborted.advance(seconds(31)).leased(W3)
    aborted.record(AbortHandoff("the destination never came"), worker=W3)
    aborted.resumed(W3)
    aborted.intended("op-after-abort", worker=W3)

    assert audited(late.log) == set()
    assert audited(aborted.log) == set()


def authorized() -> History:
    """W1 holds epoch 1 with a grant from the operator, passing evidence for P in WORKSPACE and an approval for P."""
    history = given().opened().leased(W1)
    history.record(GrantAuthority("g1", "cap://git#push", W1, 1, ttl_ms=20_000), worker=OPERATOR)
    history.record(RecordEvidence("V", P, WORKSPACE, "rel-1", "pass"), worker=VERIFIER)
    history.record(GrantApproval("a-1", P), worker=APPROVER)
    return history


def commit(op_id: str, proposal: str = P, grant: str = "g1", workspace: str = WORKSPACE) -> RecordIntent:
    context = IntentContext(9, "git_push", "write", grant, workspace, proposal)
    return RecordIntent(op_id, "effect", "git@1", context, f"idem-{op_id}")


def commit_body(op_id: str, *, proposal: str = P, grant: str = "g1", workspace: str = WORKSPACE) -> IntentRecorded:
    """The intent ``decide`` records for ``commit(...)`` when it allows it, built by hand to be forged."""
    context = IntentContext(9, "git_push", "write", grant, workspace, proposal)
    return IntentRecorded(op_id, "effect", "git@1", context, context_digest(context), f"idem-{op_id}", Usage(calls=1))


def test_grants_approvals_evidence_and_a_takeover_audit_clean() -> None:
    """Given a granted, approved and verified commit, a revocation, a denial and a takeover with fresh grants,
    then no problem."""
    history = authorized()
    history.record(commit("commit"))
    history.record(RecordObservation("commit", commit_body("commit").context_digest, "ok"))
    history.record(RevokeAuthority("g1", "rotated"), worker=OPERATOR)
    history.record(DenyApproval("a-2", P2, "not this one"), worker=APPROVER)
    history.advance(seconds(31)).leased(W2)
    history.record(GrantAuthority("g2", "cap://git#push", W2, 2), worker=OPERATOR)
    history.record(commit("commit-2", grant="g2"), worker=W2)

    assert audited(history.log) == set()


# -- forged handoffs ------------------------------------------------------------------------------


def test_an_acceptance_of_another_digest_is_a_handoff_mismatch() -> None:
    """Given a prepared handoff, when an acceptance quoting another digest is stored, then handoff_mismatch there."""
    history = sealed()
    data, digest = prepared(history)
    (body,) = history.when(AcceptHandoff(data, digest), worker=W2)
    at = forge(history, msgspec.structs.replace(body, document_digest=OTHER), worker=W2)

    assert audited(history.log) == {(at, "handoff_mismatch")}


def test_an_acceptance_restating_another_run_is_a_handoff_mismatch() -> None:
    """Given the prepared digest but another source epoch and carried usage, then handoff_mismatch there."""
    history = sealed()
    data, digest = prepared(history)
    (body,) = history.when(AcceptHandoff(data, digest), worker=W2)
    assert isinstance(body, HandoffAccepted)
    carried = msgspec.structs.replace(body.carried, calls=body.carried.calls + 5)
    at = forge(history, msgspec.structs.replace(body, source_epoch=7, carried=carried), worker=W2)

    problems = audit_events(RUN, history.log)
    assert found(problems) == {(at, "handoff_mismatch")}
    assert "source_epoch 7" in problems[0].detail and "carried usage" in problems[0].detail


def test_a_second_acceptance_and_one_with_none_prepared_are_second_successors() -> None:
    """Given an accepted handoff, when it is accepted again, then second_successor; so for an acceptance of a
    digest never prepared."""
    history = handed_over()
    accepted = history.log[-1].body
    again = forge(history, accepted, worker=W2)
    other = forge(history, msgspec.structs.replace(accepted, document_digest=OTHER), worker=W2)

    assert audited(history.log) == {(again, "second_successor"), (other, "second_successor")}


def test_work_of_the_destination_before_it_accepts_is_handoff_pending() -> None:
    """Given a prepared handoff, when the destination records an intent before accepting, then handoff_pending;
    the source's late append is not_lease_holder."""
    history = sealed()
    prepared(history)
    intent = commit_body("early", proposal="", grant="")
    early = forge(history, intent, worker=W2)
    late = forge(history, msgspec.structs.replace(intent, op_id="late"), worker=W1, epoch=1)

    assert audited(history.log) == {(early, "handoff_pending"), (late, "stale_epoch")}


def test_the_lease_move_is_exempt_only_right_after_its_prepare_in_the_same_submission() -> None:
    """Given the prepare's two events stored as two submissions, or a move to another worker, then the grant is
    lease_held and epoch_not_increasing as any other grant would be."""
    split = sealed()
    bodies = split.when(PrepareHandoff(document(split, W2)[0]))
    forge(split, bodies[0])
    moved = forge(split, bodies[1], epoch=1)

    elsewhere = sealed()
    prep, grant = elsewhere.when(PrepareHandoff(document(elsewhere, W2)[0]))
    assert isinstance(grant, LeaseGranted)
    at = forge(elsewhere, prep, msgspec.structs.replace(grant, worker=W3), epoch=1)

    assert audited(split.log) == {(moved, "lease_held"), (moved, "epoch_not_increasing")}
    assert audited(elsewhere.log) == {(at + 1, "lease_held"), (at + 1, "epoch_not_increasing")}


def test_an_imported_acceptance_after_the_first_event_is_a_duplicate_open() -> None:
    """Given an opened run, when an imported HandoffAccepted is stored in it, then duplicate_open there."""
    source = sealed()
    data, digest = prepared(source, to_store=DESTINATION_STORE)
    (imported, _) = given().when(claimed_import(data, digest, RUN), worker=W2)
    history = given().opened().leased(W1)
    at = forge(history, imported, worker=W2, epoch=2)

    assert audited(history.log) == {(at, "duplicate_open")}


def test_an_abort_with_nothing_pending_is_a_handoff_mismatch() -> None:
    """Given no prepared handoff, when an abort is stored, then handoff_mismatch there."""
    history = sealed()
    at = forge(history, HandoffAborted(OTHER, "nothing to abort"))

    assert audited(history.log) == {(at, "handoff_mismatch")}


# -- forged authority -----------------------------------------------------------------------------


def test_a_grant_or_approval_from_the_holder_is_self_authorization_and_authorizes_nothing() -> None:
    """Given W1 holding the lease, when it grants itself authority and approves its own proposal, then
    self_authorization at both, and the effect relying on them is authority_missing (the first of the domain's
    checks that fails, as ``domain.authority.require_authority`` is the rule the audit applies)."""
    history = given().opened().leased(W1)
    history.record(RecordEvidence("V", P, WORKSPACE, "rel-1", "pass"), worker=VERIFIER)
    body = commit_body("commit")
    grant = forge(history, AuthorityGranted("g1", "cap://git#push", W1, 1, W1))
    approval = forge(history, ApprovalGranted("a-1", P, W1, "commit", history.now + seconds(60)))
    effect = forge(history, body)

    assert audited(history.log) == {
        (grant, "self_authorization"),
        (approval, "self_authorization"),
        (effect, "authority_missing"),
    }


def test_a_grant_for_another_worker_or_epoch_is_unbound_and_revoking_none_is_authority_missing() -> None:
    """Given W1 at epoch 1, when a grant for W1 at epoch 0 and a revocation of an unknown grant are stored,
    then grant_unbound and authority_missing."""
    history = given().opened().leased(W1)
    stale = forge(history, AuthorityGranted("g0", "cap://x", W1, 0, OPERATOR), worker=OPERATOR)
    revoked = forge(history, AuthorityRevoked("ghost", "rotated"), worker=OPERATOR)

    assert audited(history.log) == {(stale, "grant_unbound"), (revoked, "authority_missing")}


def test_an_effect_after_its_grant_died_or_expired_is_authority_missing() -> None:
    """Given a grant of epoch 1, when W2 at epoch 2 (or W1 after the grant's ttl) names it, then authority_missing."""
    expired = authorized().advance(seconds(21))
    late = forge(expired, commit_body("commit"))

    taken = authorized().advance(seconds(31)).leased(W2)
    body = commit_body("commit")
    dead = forge(taken, body, worker=W2)

    assert audited(expired.log) == {(late, "authority_missing")}
    assert audited(taken.log) == {(dead, "authority_missing")}


def test_a_commit_of_an_unapproved_or_unverified_proposal_is_found() -> None:
    """Given approval and evidence for P in WORKSPACE under rel-1, when commits of P', of P in another workspace
    and of P verified under another release are stored, then approval_mismatch / reverification_required."""
    history = authorized()
    other = forge(history, commit_body("c-1", proposal=P2))
    moved = forge(history, commit_body("c-2", workspace="sha256:" + "dd" * 32))
    released = given().opened().leased(W1)
    released.record(GrantAuthority("g1", "cap://git#push", W1, 1), worker=OPERATOR)
    released.record(RecordEvidence("V", P, WORKSPACE, "rel-0", "pass"), worker=VERIFIER)
    released.record(GrantApproval("a-1", P), worker=APPROVER)
    elsewhere = forge(released, commit_body("c-3"))

    assert audited(history.log) == {
        (other, "approval_mismatch"),  # the first failing check; its missing evidence is not reported apart
        (moved, "reverification_required"),
    }
    assert audited(released.log) == {(elsewhere, "reverification_required")}


def test_evidence_is_a_verifiers_never_the_holders() -> None:
    """Given W1 holding the lease, when evidence from W3 and then from W1 itself is stored, then only
    the holder's is found, as self_authorization."""
    history = given().opened().leased(W1)
    forge(history, EvidenceRecorded("V", P, WORKSPACE, "rel-1", "pass"), worker=W3)
    at = forge(history, EvidenceRecorded("V2", P, WORKSPACE, "rel-1", "pass"), worker=W1)

    assert audited(history.log) == {(at, "self_authorization")}
