"""Given a run, when authority, approvals and evidence are recorded, then effects need exactly what
binds them, and the gateway answers only for the live epoch (domain/authority.py)."""

from __future__ import annotations

import msgspec
import pytest

from baton.domain.authority import gate, gate_key
from baton.domain.commands import (
    DenyApproval,
    GrantApproval,
    GrantAuthority,
    ReconcileIntent,
    RecordEvidence,
    RecordIntent,
    RevokeAuthority,
)
from baton.domain.events import AuthorityGranted, IntentContext, PolicySet, RunOpened, RunPolicy

from .given import W1, W2, History, given, intent, open_run, seconds

OPERATOR = "operator"
VERIFIER = "ci"
P = "sha256:" + "aa" * 32
WORKSPACE = "sha256:" + "bb" * 32


def committing(proposal: str = P, grant: str = "", workspace: str = WORKSPACE) -> RecordIntent:
    context = IntentContext(9, "git_push", "write", grant, workspace, proposal)
    return RecordIntent("commit", "effect", "git@1", context, "idem-commit")


def approved() -> History:
    """W1 holds epoch 1; P has passing evidence in WORKSPACE under release rel-1 and an approval."""
    history = given().opened().leased(W1)
    history.record(RecordEvidence("V", P, WORKSPACE, "rel-1", "pass"), worker=VERIFIER)
    history.record(GrantApproval("a-1", P), worker=OPERATOR)
    return history


def test_a_grant_binds_the_live_lease_and_comes_from_someone_else() -> None:
    """An operator grants W1 at epoch 1 a capability reference; W1 cannot grant itself; epoch 0 is stale."""
    history = given().opened().leased(W1)

    assert history.when(GrantAuthority("g1", "cap://git#push", W1, 1), worker=OPERATOR) == [
        AuthorityGranted("g1", "cap://git#push", W1, 1, OPERATOR, None)
    ]
    assert history.rejects(GrantAuthority("g1", "cap://git#push", W1, 1)).reason == "self_authorization"
    assert history.rejects(GrantAuthority("g1", "cap://git#push", W1, 0), worker=OPERATOR).reason == "stale_epoch"


def test_an_effect_naming_a_grant_needs_it_live_for_the_submitter_at_this_epoch() -> None:
    """Grants die with their epoch: after a takeover the new holder needs its own."""
    history = given().opened().leased(W1)
    history.record(GrantAuthority("g1", "cap://deploy", W1, 1), worker=OPERATOR)
    deploy = RecordIntent("d", "effect", "deploy@1", IntentContext(1, "deploy", authorization="g1"), "k")
    assert history.when(deploy)  # accepted while the grant is live

    history.advance(seconds(31)).leased(W2)

    assert history.state.grants == {}
    assert history.rejects(deploy, worker=W2).reason == "authority_missing"


def test_revoked_grant_no_longer_authorizes() -> None:
    """Revoking a grant takes effect for the next intent."""
    history = given().opened().leased(W1)
    history.record(GrantAuthority("g1", "cap://deploy", W1, 1), worker=OPERATOR)
    history.record(RevokeAuthority("g1", "rotated"), worker=OPERATOR)
    deploy = RecordIntent("d", "effect", "deploy@1", IntentContext(1, "deploy", authorization="g1"), "k")

    assert history.rejects(deploy).reason == "authority_missing"


def test_committing_the_approved_artifact_is_accepted_and_any_other_is_refused() -> None:
    """An approval for P authorizes P only; the refusal names what is approved."""
    history = approved()

    assert history.when(committing(P))
    refusal = history.rejects(committing("sha256:" + "cc" * 32))
    assert refusal.reason == "approval_mismatch" and P in refusal.message


@pytest.mark.parametrize(
    ("change", "reason"),
    [("workspace", "reverification_required"), ("denied", "approval_mismatch"), ("own approval", "self_authorization")],
)
def test_a_changed_binding_needs_verifying_or_approving_again(change: str, reason: str) -> None:
    """Evidence binds the workspace snapshot; a denial withdraws the approval; nobody approves their own work."""
    history = approved()
    if change == "workspace":
        assert history.rejects(committing(workspace="sha256:" + "dd" * 32)).reason == reason
    elif change == "denied":
        history.record(DenyApproval("a-2", P, "found a bug"), worker=OPERATOR)
        assert history.rejects(committing()).reason == reason
    else:
        assert history.rejects(GrantApproval("a-3", P)).reason == reason


def test_evidence_from_another_release_requires_reverification() -> None:
    """Evidence that ran under another release does not vouch for this run's release."""
    history = given().opened().leased(W1)
    history.record(RecordEvidence("V", P, WORKSPACE, "rel-0", "pass"), worker=VERIFIER)
    history.record(GrantApproval("a-1", P), worker=OPERATOR)

    assert history.rejects(committing()).reason == "reverification_required"


def test_credential_material_in_any_submission_is_refused_and_nothing_changes() -> None:
    """A bearer token or a secret-named key anywhere in a command is credential_in_payload."""
    history = given().opened().leased(W1)

    leaked = intent("op-1", arguments={"headers": {"Authorization": "Bearer abcdefghijklmnopqrstuvwxyz0123456789"}})
    assert history.rejects(leaked).reason == "credential_in_payload"
    assert history.rejects(intent("op-2", arguments={"aws_secret_access_key": "x"})).reason == "credential_in_payload"


def test_gate_allows_only_the_live_epoch_with_an_open_intent_and_live_authority() -> None:
    """The mutation gateway: yes for the holder's open intent; no for stale epochs, unknown or settled ops."""
    history = given().opened().leased(W1)
    history.record(GrantAuthority("g1", "cap://deploy", W1, 1), worker=OPERATOR)
    history.record(RecordIntent("d", "effect", "deploy@1", IntentContext(1, "deploy", authorization="g1"), "k"))

    assert gate(history.state, W1, 1, "d", history.now).allowed
    assert gate(history.state, W1, 0, "d", history.now).reason == "stale_epoch"
    assert gate(history.state, W1, 1, "nope", history.now).reason == "unknown_operation"
    history.record(RevokeAuthority("g1", "rotated"), worker=OPERATOR)
    assert gate(history.state, W1, 1, "d", history.now).reason == "authority_missing"
    history.advance(seconds(31))
    assert gate(history.state, W1, 1, "d", history.now).reason == "lease_expired"


def test_gate_by_key_answers_for_the_open_intent_holding_the_key() -> None:
    """Asked by idempotency key, the gateway gates the open intent that gave the system that key
    exactly as by op id: yes for its holder at its epoch; no for a stale epoch or revoked authority."""
    history = given().opened().leased(W1)
    history.record(GrantAuthority("g1", "cap://deploy", W1, 1), worker=OPERATOR)
    history.record(RecordIntent("d", "effect", "deploy@1", IntentContext(1, "deploy", authorization="g1"), "K"))

    assert gate_key(history.state, W1, 1, "K", history.now) == gate(history.state, W1, 1, "d", history.now)
    assert gate_key(history.state, W1, 1, "K", history.now).allowed
    assert gate_key(history.state, W1, 0, "K", history.now).reason == "stale_epoch"
    history.record(RevokeAuthority("g1", "rotated"), worker=OPERATOR)
    assert gate_key(history.state, W1, 1, "K", history.now).reason == "authority_missing"


def test_gate_by_key_after_a_takeover_says_reconciliation_required() -> None:
    """The new holder asking about the key of an intent the old epoch left open is told to reconcile."""
    history = given().opened().leased(W1).intended("op-1").advance(seconds(31)).leased(W2)

    assert gate_key(history.state, W2, 2, "idem-op-1", history.now).reason == "reconciliation_required"


def test_gate_by_key_of_an_intent_with_an_outcome_is_already_observed() -> None:
    """A key whose intent was observed (or reconciled applied) is used: denied already_observed, and the
    detail says the key was used, so the host does not perform it again."""
    history = given().opened().leased(W1).intended("op-1").observed("op-1")

    decision = gate_key(history.state, W1, 1, "idem-op-1", history.now)
    assert (decision.allowed, decision.reason) == (False, "already_observed")
    assert "idem-op-1" in decision.detail and "used" in decision.detail


def test_gate_by_an_unknown_or_given_back_key_is_unknown_operation() -> None:
    """A key no intent holds is unknown_operation: never used, or given back by a not_applied
    reconciliation (a new intent may use it); an empty key is malformed; a stale asker is stale_epoch
    whatever the key."""
    history = given().opened().leased(W1).intended("op-1")
    history.record(ReconcileIntent("op-1", "not_applied", "host has no idem-op-1"))

    assert gate_key(history.state, W1, 1, "never", history.now).reason == "unknown_operation"
    assert gate_key(history.state, W1, 1, "idem-op-1", history.now).reason == "unknown_operation"
    assert gate_key(history.state, W1, 1, "", history.now).reason == "malformed"
    assert gate_key(history.state, W2, 1, "never", history.now).reason == "stale_epoch"
    history.advance(seconds(31))
    assert gate_key(history.state, W1, 1, "never", history.now).reason == "lease_expired"


def test_verifier_evidence_from_the_lease_holder_is_refused() -> None:
    """The holder cannot vouch for its own work: evidence is a verifier's."""
    history = given().opened().leased(W1)

    assert history.rejects(RecordEvidence("V", P, WORKSPACE, "rel-1", "pass")).reason == "self_authorization"


# --------------------------------------------------------------------------------------------------
# Run policy: what effects under given tool contracts need, whatever fields the worker filled
# --------------------------------------------------------------------------------------------------

POLICY = RunPolicy(approval_required=("git@*",), evidence_required=("git@*",))


def under_policy(policy: RunPolicy = POLICY) -> History:
    history = given()
    history.record(msgspec.structs.replace(open_run(), policy=policy))
    return history.leased(W1)


def test_a_run_opened_with_a_policy_records_it_and_one_without_opens_as_before() -> None:
    assert [type(e) for e in given().when(msgspec.structs.replace(open_run(), policy=POLICY))] == [RunOpened, PolicySet]
    assert [type(e) for e in given().when(open_run())] == [RunOpened]


def test_an_effect_under_policy_needs_its_proposal_named_approved_and_verified() -> None:
    history = under_policy()
    unnamed = RecordIntent("c0", "effect", "git@1", IntentContext(9, "git_push", "write", state_digest=WORKSPACE), "k0")

    assert history.rejects(unnamed).reason == "approval_missing"  # no proposal_digest: nothing to check
    assert history.rejects(committing()).reason == "approval_missing"
    history.record(GrantApproval("a-1", P), worker=OPERATOR)
    assert history.rejects(committing()).reason == "evidence_missing"
    history.record(RecordEvidence("V", P, WORKSPACE, "rel-1", "pass"), worker=VERIFIER)
    assert history.when(committing())
    other = RecordIntent("e", "effect", "editor@1", IntentContext(1, "edit", "write"), "ke")
    assert history.when(other)  # a contract the policy does not name needs nothing


def test_approvals_are_artifact_bound_unless_the_policy_binds_them_to_the_epoch() -> None:
    """After a takeover, an approval of P still approves P by default; under ``approvals="epoch"`` it ends."""
    for approvals, expected in (("artifact", None), ("epoch", "approval_missing")):
        history = under_policy(msgspec.structs.replace(POLICY, approvals=approvals))
        history.record(RecordEvidence("V", P, WORKSPACE, "rel-1", "pass"), worker=VERIFIER)
        history.record(GrantApproval("a-1", P), worker=OPERATOR)
        history.advance(seconds(31)).leased(W2)

        if expected is None:
            assert history.when(committing(), worker=W2)
        else:
            assert history.rejects(committing(), worker=W2).reason == expected
