"""The audit fold: valid histories audit clean; each kind of damage is named by its code at its position."""

from __future__ import annotations

import re
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given as hypothesis_given
from hypothesis import settings
from hypothesis import strategies as st

from baton.domain.budgets import MAX_COUNTER, Ceilings, Usage
from baton.domain.canonical import canonical_bytes
from baton.domain.chain import seal, stored_bytes, verify_chain
from baton.domain.commands import CompleteRun, PurgeThread, ReleaseLease, Submission
from baton.domain.decide import context_digest
from baton.domain.errors import ChainBroken
from baton.domain.events import (
    ApprovalDenied,
    ApprovalGranted,
    AuthorityGranted,
    AuthorityRevoked,
    BlobRef,
    CheckpointRecorded,
    Event,
    EvidenceRecorded,
    HandoffConfirmed,
    IntentReconciled,
    IntentRecorded,
    LeaseExpired,
    LeaseGranted,
    ObservationRecorded,
    PolicySet,
    PrincipalAdded,
    PrincipalRevoked,
    PrincipalRolesChanged,
    RecordedEvent,
    RegistryOpened,
    RunCompleted,
    RunOpened,
    ThreadDeleted,
    ThreadPruned,
    ThreadPurged,
    TransitionRecorded,
)
from baton.domain.stages import Stage
from baton.domain.threads import PURGE_TOMBSTONE
from baton.projections import audit_handoff as handoff_rules
from baton.projections import audit_rules as run_rules
from baton.projections.audit import CODES, RULES, AuditFold, Problem, audit_events, audit_stored, tombstone
from baton.projections.audit_state import AuditState, LeaseRecord, PendingHandoff

from ..domain.given import RUN, W1, W2, W3, History, altered, context, given, intent, placement, seconds
from .histories import histories

DOCS = Path(__file__).resolve().parents[3] / "docs" / "audit.md"


def stored(log: list[RecordedEvent]) -> list[bytes]:
    """The bytes the ledger stores (``domain.chain.stored_form``)."""
    return [stored_bytes(event) for event in log]


def legacy(log: list[RecordedEvent]) -> list[bytes]:
    """The bytes stores written before the stored form hold: msgspec's JSON of the envelope."""
    return [msgspec.json.encode(event) for event in log]


def found(problems: list[Problem]) -> set[tuple[int, str]]:
    assert all(p.code in CODES for p in problems), problems
    return {(p.position, p.code) for p in problems}


def forge(history: History, body: Event, *, worker: str = W1, epoch: int | None = None, now: int | None = None) -> None:
    """Append ``body`` sealed onto the log (a valid chain), bypassing ``decide``: what a rogue writer stores."""
    state = history.state
    last = history.log[-1]
    submission = Submission(f"forged-{len(history.log)}", RUN, worker, ReleaseLease(), 0)
    epoch = state.epoch if epoch is None else epoch
    (event,) = seal(RUN, last.position, last.digest, submission, epoch, [body], now or history.now)
    history.log.append(event)


def leased() -> History:
    return given().opened().leased(W1)


def intent_body(op_id: str, *, charge: Usage | None = None, kind: str = "effect") -> IntentRecorded:
    ctx = context(op_id)
    return IntentRecorded(op_id, kind, "tool@1", ctx, context_digest(ctx), f"idem-{op_id}", charge or Usage(calls=1))  # type: ignore[arg-type]


# -- valid histories ----------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@hypothesis_given(histories(max_steps=60))
def test_valid_histories_audit_clean_in_every_form(log: list[RecordedEvent]) -> None:
    """Given any history decide accepted, when audited from envelopes, stored bytes (today's or an older
    store's) or export lines, then no problem."""
    anchor = (log[-1].position, log[-1].digest)
    assert audit_events(RUN, log, anchor) == []
    assert audit_stored(RUN, stored(log), anchor) == []
    assert audit_stored(RUN, legacy(log), anchor) == []
    assert audit_stored(RUN, [canonical_bytes(msgspec.to_builtins(e)) for e in log], anchor) == []


@settings(max_examples=60, deadline=None)
@hypothesis_given(histories(min_steps=3, max_steps=30), st.data())
def test_an_altered_field_is_found_where_verify_chain_breaks(log: list[RecordedEvent], data: st.DataObject) -> None:
    """Given a valid history with one envelope field altered, when audited, then the first problem is verify_chain's."""
    raw = stored(log)
    index = data.draw(st.integers(0, len(raw) - 1), label="index")
    envelope = msgspec.json.decode(raw[index])
    name = data.draw(st.sampled_from(["epoch", "worker", "recorded_at", "prev_digest", "submission_id"]), label="field")
    envelope[name] = altered(envelope[name])
    raw[index] = msgspec.json.encode(envelope)
    with pytest.raises(ChainBroken) as broken:
        verify_chain(raw, run_id=RUN)

    problems = audit_stored(RUN, raw)

    assert problems[0].position == broken.value.position == index + 1
    assert problems[0].code in {"digest_mismatch", "broken_link"}


def test_memory_holds_only_open_intents() -> None:
    """Given 1,000 settled operations and one open one, when folded, then the fold keeps one operation."""
    history = leased()
    for i in range(1000):
        history.intended(f"op-{i}", kind="pure").observed(f"op-{i}")
    history.intended("open", kind="pure")
    fold = AuditFold(RUN)
    for event in history.log:
        fold.apply(event)
    assert fold.finish() == []
    assert list(fold.state.operations) == ["open"]


# -- the chain ----------------------------------------------------------------------------------


def five() -> list[RecordedEvent]:
    """Opened, leased, intent, observation, transition: positions 1..5."""
    history = leased().intended("op-1").observed("op-1")
    history.moved_to(Stage.CANDIDATE_READY)
    assert len(history.log) == 5
    return history.log


def test_altered_bytes_are_a_digest_mismatch_there() -> None:
    """Given one stored value changed, when audited, then digest_mismatch at its position and nothing before."""
    raw = stored(five())
    raw[3] = raw[3].replace(b'"outcome":"ok"', b'"outcome":"failed"')
    problems = audit_stored(RUN, raw)
    assert problems[0] == Problem(RUN, 4, "digest_mismatch", problems[0].detail)


def test_gap_swap_duplicate_and_out_of_order_positions() -> None:
    """Given events deleted, swapped, repeated or moved back, when audited, then each has its own code and position."""
    raw = stored(five())
    assert found(audit_stored(RUN, [raw[0], raw[1], raw[3], raw[4]])) >= {(3, "position_gap")}
    swapped = audit_stored(RUN, [raw[0], raw[1], raw[3], raw[2], raw[4]])
    assert [(p.position, p.code) for p in swapped] == [(3, "position_swap")]  # re-ordered, the rest holds
    assert (3, "position_duplicate") in found(audit_stored(RUN, [*raw[:3], raw[2], *raw[3:]]))
    assert (2, "position_out_of_order") in found(audit_stored(RUN, [*raw, raw[1]]))
    assert found(audit_stored(RUN, raw[:4])) == set()  # a cut-off tail needs the anchor ...
    assert found(audit_stored(RUN, raw[:4], anchor=(5, five()[-1].digest))) == {(5, "head_mismatch")}


def test_a_resealed_suffix_without_the_original_predecessor_breaks_the_link() -> None:
    """Given positions 4-5 forged and chained onto a made-up predecessor digest, then broken_link at 4."""
    log = five()
    body = msgspec.structs.replace(log[3].body, result={"forged": True})
    submission = Submission("forged", RUN, W1, ReleaseLease(), 1)
    forged = seal(RUN, 3, "sha256:" + "f" * 64, submission, 1, [body, log[4].body], log[3].recorded_at)
    problems = audit_events(RUN, [*log[:3], *forged], anchor=(5, log[-1].digest))
    assert found(problems) == {(4, "broken_link"), (5, "head_mismatch")}


def test_undecodable_and_wrong_run_events() -> None:
    """Given bytes that are not an envelope, or an envelope of another run, then undecodable / wrong_run."""
    raw = stored(five())
    assert (3, "undecodable") in found(audit_stored(RUN, [raw[0], raw[1], b"{not json", raw[3], raw[4]]))
    other = msgspec.json.decode(raw[2])
    other["run_id"] = "other"
    assert (3, "wrong_run") in found(audit_stored(RUN, [raw[0], raw[1], msgspec.json.encode(other)]))


# -- ownership ----------------------------------------------------------------------------------


def taken_over() -> History:
    """W1 held epoch 1; its lease expired and W2 took epoch 2."""
    return leased().advance(seconds(31)).leased(W2)


def test_an_event_from_a_stale_epoch_is_found() -> None:
    """Given W2 at epoch 2, when W1 appends at epoch 1 behind the fence's back, then stale_epoch there."""
    history = taken_over()
    forge(history, intent_body("late"), worker=W1, epoch=1)
    assert found(audit_events(RUN, history.log)) == {(len(history.log), "stale_epoch")}


def test_fenced_events_need_the_live_lease_of_their_epoch() -> None:
    """A stranger at the current epoch, anyone without a lease, or after expiry: not_lease_holder / lease_expired."""
    history = leased()
    forge(history, intent_body("x"), worker=W3)
    assert found(audit_events(RUN, history.log)) == {(3, "not_lease_holder")}
    history = given().opened()
    forge(history, intent_body("x"), worker=W1, epoch=0)
    assert found(audit_events(RUN, history.log)) == {(2, "not_lease_holder")}
    history = leased().advance(seconds(31))
    forge(history, intent_body("x"))
    assert found(audit_events(RUN, history.log)) == {(3, "lease_expired")}


def test_a_lease_must_advance_the_epoch_and_not_overlap() -> None:
    """Given a live lease, when another grant of the same epoch is forged, then lease_held and epoch_not_increasing."""
    history = leased()
    forge(history, LeaseGranted(W2, 1, placement(W2), history.now + seconds(30)), worker=W2, epoch=1)
    assert found(audit_events(RUN, history.log)) == {(3, "lease_held"), (3, "epoch_not_increasing")}


# -- operations, budgets, stages, the end ---------------------------------------------------------


def test_outcomes_must_answer_an_open_intent_with_its_context() -> None:
    """Observations without an intent, with another context, or settling twice: unknown_operation / context_mismatch."""
    history = leased().intended("op-1")
    forge(history, ObservationRecorded("op-1", "sha256:other", "ok", Usage()))
    forge(history, IntentReconciled("op-1", "applied", "log"))
    forge(history, ObservationRecorded("ghost", "sha256:x", "ok", Usage()))
    assert found(audit_events(RUN, history.log)) == {
        (4, "context_mismatch"),
        (5, "unknown_operation"),
        (6, "unknown_operation"),
    }


def test_an_earlier_epochs_intent_is_reconciled_not_observed() -> None:
    """Given an intent of epoch 1, when W2 at epoch 2 observes it, then reconciliation_required; new effects wait."""
    history = leased().intended("op-1").advance(seconds(31)).leased(W2)
    ctx_digest = context_digest(context("op-1"))
    forge(history, intent_body("op-2"), worker=W2)
    forge(history, ObservationRecorded("op-1", ctx_digest, "ok", Usage()), worker=W2)
    problems = found(audit_events(RUN, history.log))
    assert problems == {(7, "uncertain_intent"), (8, "reconciliation_required")}  # 6: W2's resume_from


def test_duplicate_intents_and_a_context_digest_that_is_not_the_contexts() -> None:
    """Given an intent reusing an open op id, or quoting a wrong context digest, then their codes."""
    history = leased().intended("op-1")
    forge(history, intent_body("op-1"))
    forge(history, msgspec.structs.replace(intent_body("op-2"), context_digest="sha256:made-up"))
    assert found(audit_events(RUN, history.log)) == {(4, "duplicate_operation"), (5, "context_digest_mismatch")}


def test_a_wrong_context_digest_is_found_from_stored_bytes_too() -> None:
    """Given an intent quoting a wrong context digest in a valid chain, when its stored bytes are audited
    (the digest fast path, which computes the context digest with the envelope's), then its code there."""
    history = leased().intended("op-1")
    forge(history, msgspec.structs.replace(intent_body("op-2"), context_digest="sha256:made-up"))
    forge(history, intent_body("op-3"))
    assert found(audit_stored(RUN, stored(history.log))) == {(4, "context_digest_mismatch")}


@pytest.mark.parametrize("encode", [stored, legacy])
def test_strings_that_need_escaping_audit_clean_and_a_changed_byte_among_them_is_found(
    encode: Callable[[list[RecordedEvent]], list[bytes]],
) -> None:
    """Given stored strings with quotes, backslashes, control characters and non-ASCII text, when audited,
    then clean; when one of their bytes changes, then digest_mismatch (and its context's) at that position."""
    history = leased()
    for index, text in enumerate(['say "hi"', "C:\\temp", "line\nbreak", "é \U0001f600", "plain"]):
        history.record(intent(f"op-{index}", "pure", arguments={"cmd": text}), alongside=True)
    raw = encode(history.log)
    assert audit_stored(RUN, raw) == []
    assert b"\\\\temp" in raw[3]
    raw[3] = raw[3].replace(b"\\\\temp", b"\\\\tmp")
    assert found(audit_stored(RUN, raw)) == {(4, "digest_mismatch"), (4, "context_digest_mismatch")}


def test_budgets_never_decrease_and_never_pass_a_ceiling() -> None:
    """Given a ceiling of 2 calls, when 3 intents and a negative charge are forged, then the budget codes."""
    history = given().opened(Ceilings(calls=2)).leased(W1).intended("op-1", kind="pure")
    forge(history, intent_body("op-2", kind="pure"))
    forge(history, intent_body("op-3", kind="pure"))
    forge(history, intent_body("op-4", kind="pure", charge=Usage(calls=-1)))
    forge(history, intent_body("op-5", kind="pure"))
    assert found(audit_events(RUN, history.log)) == {(5, "budget_exceeded"), (6, "budget_decreased")}


def test_repeated_charges_add_up_and_a_counter_passing_the_maximum_is_reported_once() -> None:
    """Given the same charges forged again and again (a big one twice, a negative one twice), when audited,
    then the counter that passes 2^63-1 is reported where it first passes, and each negative charge."""
    history = given().opened().leased(W1)
    big = Usage(fuel=MAX_COUNTER // 2 + 1)
    for op_id, charge in [("a", big), ("b", Usage(calls=1)), ("c", big), ("d", big), ("e", Usage(fuel=-1))]:
        forge(history, intent_body(op_id, kind="pure", charge=charge))
    forge(history, intent_body("f", kind="pure", charge=Usage(fuel=-1)))
    assert found(audit_events(RUN, history.log)) == {
        (5, "counter_overflow"),
        (7, "budget_decreased"),
        (8, "budget_decreased"),
    }


def test_stages_move_legally_and_nothing_follows_the_end() -> None:
    """Given a skipped stage, a completion while COMMITTING and an event after it, then their codes."""
    history = leased()
    forge(history, TransitionRecorded(Stage.GENERATING, Stage.VERIFIED, "sha256:s", Usage(stages=1)))
    history2 = leased().moved_to(Stage.COMMITTING)
    forge(history2, RunCompleted("done"))
    forge(history2, intent_body("after"))
    assert found(audit_events(RUN, history.log)) == {(3, "illegal_transition")}
    end = len(history2.log)
    assert found(audit_events(RUN, history2.log)) == {
        (end - 1, "illegal_transition"),
        (end, "after_terminal"),
        (end, "not_lease_holder"),
    }


def completed() -> History:
    history = leased().moved_to(Stage.COMMITTED)
    history.record(CompleteRun("done"))
    return history


def test_a_purge_after_the_end_audits_clean() -> None:
    """Given a completed run, when an operator purges its thread (allowed on an ended run), then the
    tombstone and the erasure record are not reported as after_terminal; another event still is."""
    history = completed()
    history.record(PurgeThread("gdpr request", 3, "sha256:" + "0" * 64), worker=W2)
    assert found(audit_events(RUN, history.log)) == set()
    forge(history, intent_body("after"))
    assert (len(history.log), "after_terminal") in found(audit_events(RUN, history.log))


def test_thread_events_are_the_holders_work_but_a_purge_is_anyones() -> None:
    """Given a leased run, when another worker's checkpoint, tombstone or pruning is forged,
    then each is not_lease_holder; when another worker purges (decided, an operator's right), the audit is clean."""
    history = leased()
    document = BlobRef("sha256:" + "cd" * 32, 10, "blob://doc")
    forge(history, CheckpointRecorded("", "c1", document), worker=W2)
    forge(history, ThreadDeleted("by the wrong worker"), worker=W2)
    forge(history, ThreadPruned("delete", 3), worker=W2)
    n = len(history.log)
    assert found(audit_events(RUN, history.log)) == {
        (n - 2, "not_lease_holder"),
        (n - 1, "not_lease_holder"),
        (n, "not_lease_holder"),
    }
    purged = leased()
    purged.record(PurgeThread("gdpr request", 1, "sha256:" + "0" * 64), worker=W2)
    assert found(audit_events(RUN, purged.log)) == set()


# What the ledger lets anyone append (``decide``'s unfenced commands: open, acquire, expire, authority
# and approval decisions, purge): the audit must not hold these to the lease. Every other event type
# must be fence-checked, so a new event type cannot slip past the auditor unnoticed.
UNFENCED = {
    RunOpened,
    LeaseGranted,
    LeaseExpired,
    AuthorityGranted,
    AuthorityRevoked,
    ApprovalGranted,
    ApprovalDenied,
    EvidenceRecorded,
    PolicySet,
    ThreadPurged,
    HandoffConfirmed,  # the destination worker's word, after its lease in the source may have lapsed
}
REGISTRY = {RegistryOpened, PrincipalAdded, PrincipalRolesChanged, PrincipalRevoked}  # an operator's, no lease


def test_every_event_type_is_fence_checked_unless_anyone_may_append_it() -> None:
    """Given the event catalogue, then each type's audit rules check the fence (some conditionally: an
    import's acceptance, a purge's tombstone) unless the ledger lets anyone append it."""
    fence_checking = {run_rules.fenced, tombstone, handoff_rules.accepted}
    checked = {kind for kind, chain in RULES.items() if fence_checking & set(chain)}
    catalogue = set(typing.get_args(Event))
    assert catalogue - checked - UNFENCED - REGISTRY == set(), "event types the audit never fence-checks"
    assert checked & (UNFENCED | REGISTRY) == set()


def test_a_purge_tombstone_after_the_end_needs_its_record_right_after_it() -> None:
    """Given a completed run, when a purge's tombstone is not followed by its ThreadPurged (the log ends,
    another event follows, or the record names another tombstone), then the tombstone is after_terminal."""
    tombstone = ThreadDeleted(PURGE_TOMBSTONE + "gdpr request")
    alone = completed()
    forge(alone, tombstone)
    assert found(audit_events(RUN, alone.log)) == {(len(alone.log), "after_terminal")}
    followed = completed()
    forge(followed, tombstone)
    forge(followed, RunCompleted("again"))
    end = len(followed.log)
    assert {(end - 1, "after_terminal"), (end, "after_terminal")} <= found(audit_events(RUN, followed.log))
    misnamed = completed()
    forge(misnamed, tombstone)
    forge(misnamed, ThreadPurged(2, "gdpr request", 3, "sha256:" + "0" * 64))
    end = len(misnamed.log)
    assert found(audit_events(RUN, misnamed.log)) == {(end - 1, "after_terminal"), (end, "after_terminal")}


def test_a_stored_digest_member_that_is_not_the_digest_is_a_mismatch_there() -> None:
    """Given stored bytes whose last member (the digest) is replaced by another digest, when audited,
    then digest_mismatch at that position and the next event's link is still checked."""
    raw = stored(five())
    other = five()[0].digest.encode()
    raw[2] = raw[2][: -len(other) - 2] + other + b'"}'
    assert (3, "digest_mismatch") in found(audit_stored(RUN, raw))


def test_problems_are_capped_per_run() -> None:
    """Given many damaged events, when audited with max_problems=3, then 3 problems and too_many_problems."""
    raw = [r.replace(b'"recorded_at":', b'"recorded_at":1') for r in stored(five())]
    fold = AuditFold(RUN, max_problems=3)
    for data in raw:
        fold.apply_stored(data)
    problems = fold.finish()
    assert [p.code for p in problems][-1] == "too_many_problems"
    assert len(problems) == 4


def test_extra_rules_plug_in_per_event_type() -> None:
    """Given a rule registered for a body type, when audited, then its problem is reported at that event."""

    def no_pure(state: AuditState, event: RecordedEvent) -> None:
        body: Any = event.body
        if body.kind == "pure":
            state.report("context_mismatch", "no pure intents here")

    rules = {**RULES, IntentRecorded: (*RULES[IntentRecorded], no_pure)}
    fold = AuditFold(RUN, rules=rules)
    for event in leased().intended("op-1", kind="pure").log:
        fold.apply(event)
    assert found(fold.finish()) == {(3, "context_mismatch")}


def test_every_code_is_documented() -> None:
    """Every stable code appears in docs/audit.md, and the doc names no code that does not exist."""
    text = DOCS.read_text()
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", text, flags=re.MULTILINE))
    assert documented == set(CODES)


_EPOCHS = st.integers(0, 3)
_LEASES = st.none() | st.builds(LeaseRecord, st.sampled_from([W1, W2]), _EPOCHS, st.integers(0, 3))
_PENDING = st.none() | st.builds(
    PendingHandoff, st.just("sha256:d"), st.sampled_from([W1, W2]), _EPOCHS, st.just(1), st.just("s")
)


@settings(max_examples=500, deadline=None)
@hypothesis_given(
    _LEASES,
    _EPOCHS,
    st.booleans(),
    st.none() | st.just(1),
    _PENDING,
    st.sampled_from([W1, W2]),
    _EPOCHS,
    st.integers(0, 3),
)
def test_the_fenced_work_rule_is_the_three_rules_it_stands_for(
    lease: Any, epoch: int, opened: bool, terminal: int | None, pending: Any, worker: str, at_epoch: int, now: int
) -> None:
    """Given any run state and any envelope of fenced work, when ``fenced_work`` checks it, then it reports
    exactly what ``lifecycle``, ``fenced`` and ``not_pending`` report, in their order, and changes nothing else."""
    from baton.projections import audit_handoff, audit_rules
    from baton.projections.audit import fenced_work

    states = []
    for _ in range(2):
        state = AuditState(RUN)
        state.lease, state.epoch, state.opened, state.terminal, state.pending = lease, epoch, opened, terminal, pending
        states.append(state)
    event = RecordedEvent(RUN, 3, at_epoch, worker, "s", now, "sha256:p", RunCompleted(), "")
    fenced_work(states[0], event)
    for rule in (audit_rules.lifecycle, audit_rules.fenced, audit_handoff.not_pending):
        rule(states[1], event)
    fused, separate = states
    assert fused.problems == separate.problems
    assert [getattr(fused, name) for name in AuditState.__slots__] == [
        getattr(separate, name) for name in AuditState.__slots__
    ]


def test_the_fold_puts_fenced_work_in_place_of_the_usual_prefix_only() -> None:
    """Given the default rules and rules with another prefix, then the fold fuses exactly the usual prefix."""
    from baton.projections.audit import ENVELOPE_RULES, RULES, fenced_work

    fold = AuditFold(RUN)
    assert fold._chain(IntentRecorded) == (fenced_work, *RULES[IntentRecorded][2:])
    assert fold._chain(LeaseGranted) == (*ENVELOPE_RULES, *RULES[LeaseGranted])
    custom = AuditFold(RUN, rules={IntentRecorded: RULES[IntentRecorded][1:]})
    assert custom._chain(IntentRecorded) == (*ENVELOPE_RULES, *RULES[IntentRecorded][1:])
