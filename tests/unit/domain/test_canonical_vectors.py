"""Known-answer vectors: the exact bytes and digests Baton's hash chain is built on.

The literals below were computed once and hard-coded on purpose. Every stored log and every handoff
digest depends on them, so a change of encoding (key order, integer spelling, escaping, prefixes)
must fail here first, and loudly, rather than silently orphan existing chains. Where a digest is
pinned, it is also recomputed from the pinned bytes with ``hashlib`` so the two literals vouch for
each other. Also pinned: checked budget arithmetic and the full table of legal stage moves.
"""

from __future__ import annotations

import hashlib
import re

import msgspec
import pytest

from baton.domain import errors
from baton.domain.budgets import COUNTERS, MAX_COUNTER, Ceilings, Usage, checked_add
from baton.domain.canonical import ZERO_DIGEST, canonical_bytes, digest_of, schema_integer, short
from baton.domain.chain import EVENT_PREFIX, seal, verify_chain
from baton.domain.commands import OpenRun, Submission
from baton.domain.decide import context_digest
from baton.domain.events import (
    EVENT_TYPES,
    BlobRef,
    IntentContext,
    LeaseGranted,
    Placement,
    RecordedEvent,
    RunOpened,
)
from baton.domain.stages import REWORKABLE, Stage, is_legal

# --------------------------------------------------------------------------------------------------
# canonical_bytes
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(
            {"b": 1, "a": [True, None, "é", -5, 0]},
            b'{"a":[true,null,"\xc3\xa9","-5","0"],"b":"1"}\n',
            id="ints_to_decimal_strings_sorted_compact_raw_utf8",
        ),
        pytest.param(
            {"b": 0, "B": 0, "a": 0, "é": 0, "aa": 0, "_": 0, "Z": 0, "\U0001f600": 0, "\uffff": 0},
            b'{"B":"0","Z":"0","_":"0","a":"0","aa":"0","b":"0","\xc3\xa9":"0","\xef\xbf\xbf":"0",'
            b'"\xf0\x9f\x98\x80":"0"}\n',
            id="keys_sorted_by_code_point",
        ),
        pytest.param(
            [MAX_COUNTER, 2**70, -(2**63)],
            b'["9223372036854775807","1180591620717411303424","-9223372036854775808"]\n',
            id="integers_past_64_bits_keep_every_digit",
        ),
        pytest.param(
            '\x00\t"\\/\u2028',
            b'"\\u0000\\t\\"\\\\/\xe2\x80\xa8"\n',
            id="string_escapes",
        ),
        pytest.param(True, b"true\n", id="bool_is_not_an_int"),
        pytest.param(7, b'"7"\n', id="bare_int"),
        pytest.param(None, b"null\n", id="null"),
        pytest.param("", b'""\n', id="empty_string"),
        pytest.param({}, b"{}\n", id="empty_object"),
        pytest.param((), b"[]\n", id="empty_tuple_is_an_array"),
        pytest.param(
            Usage(calls=3),
            b'{"argument_bytes":"0","calls":"3","cost_micros":"0","fuel":"0","iterations":"0",'
            b'"reserved_fuel":"0","result_bytes":"0","stages":"0"}\n',
            id="struct_fields_sorted",
        ),
        pytest.param(
            {"turn": 1, "arguments": {"n": 1, "deep": [2, {"k": 3}]}, "result": [4]},
            b'{"arguments":{"deep":[2,{"k":3}],"n":1},"result":[4],"turn":"1"}\n',
            id="opaque_payloads_keep_json_numbers",
        ),
    ],
)
def test_canonical_bytes_known_answers(value: object, expected: bytes) -> None:
    """canonical_bytes spells each value exactly as pinned: sorted, compact, raw UTF-8, one newline."""
    assert canonical_bytes(value) == expected


def test_opaque_payload_int_and_its_decimal_string_encode_differently() -> None:
    """Inside tool arguments and results the type is data, so 1 and "1" never share bytes."""
    assert canonical_bytes({"arguments": {"n": 1}}) != canonical_bytes({"arguments": {"n": "1"}})


@pytest.mark.parametrize(
    "value",
    [1.5, 0.0, {"ratio": 1.0}, [1, [2.5]], {"arguments": {"x": 0.1}}],
    ids=["float", "zero_float", "nested_in_object", "nested_in_array", "inside_opaque_payload"],
)
def test_floats_are_rejected_with_value_error(value: object) -> None:
    """A float has no single decimal spelling, so canonical_bytes refuses it wherever it hides."""
    with pytest.raises(ValueError, match="float"):
        canonical_bytes(value)


@pytest.mark.parametrize("value", [{1: "a"}, {"ok": {2: "b"}}, [{None: 1}]], ids=["int", "nested", "none_in_list"])
def test_non_string_keys_are_rejected_with_type_error(value: object) -> None:
    """JSON objects have string keys only; any other key type is a TypeError, never coerced."""
    with pytest.raises(TypeError, match="keys must be strings"):
        canonical_bytes(value)


# --------------------------------------------------------------------------------------------------
# digests
# --------------------------------------------------------------------------------------------------


def test_event_prefix_and_zero_digest_are_pinned() -> None:
    """The domain-separation prefix of events and the genesis predecessor digest never change."""
    assert EVENT_PREFIX == b"baton.event.v1\x00"
    assert ZERO_DIGEST == "sha256:0000000000000000000000000000000000000000000000000000000000000000"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", "sha256:c5c7b2eed3705451a8244e3ad287fb2345515a180b71ccd29604458693ffd2c7"),
        (b'{"a":"1"}\n', "sha256:beb2ab01783034466228ab7abcfd7ecaa3d4ac706daf2d1341773dba52ea7d34"),
    ],
    ids=["empty", "small_object"],
)
def test_digest_of_with_the_event_prefix_known_answers(data: bytes, expected: str) -> None:
    """digest_of is 'sha256:' + hex SHA-256 over prefix + data."""
    assert digest_of(EVENT_PREFIX, data) == expected
    assert expected == "sha256:" + hashlib.sha256(b"baton.event.v1\x00" + data).hexdigest()


def test_the_prefix_separates_domains() -> None:
    """The same bytes digested without the event prefix give a different digest."""
    data = b'{"a":"1"}\n'
    assert digest_of(b"", data) == "sha256:128900eb9f368b9063eb1958cc0d40da254c25645f1c9456260817aed103de21"
    assert digest_of(b"", data) != digest_of(EVENT_PREFIX, data)


def test_context_digest_known_answer() -> None:
    """An intent's context digest is pinned, covering every context field and the context prefix."""
    context = IntentContext(
        3,
        "op-1",
        effect="write",
        authorization="auth-1",
        state_digest="sha256:s",
        proposal_digest="sha256:p",
        arguments={"path": "/tmp/x", "n": 2},
    )
    expected_bytes = (
        b'{"arguments":{"n":2,"path":"/tmp/x"},"authorization":"auth-1","effect":"write","operation":"op-1",'
        b'"proposal_digest":"sha256:p","state_digest":"sha256:s","turn":"3"}\n'
    )
    expected = "sha256:3982ea48e053438c941fee68f3fdee54a5ceb8895c86dc7aca53743ca5e7d56f"

    assert canonical_bytes(context) == expected_bytes
    assert context_digest(context) == expected
    assert expected == "sha256:" + hashlib.sha256(b"baton.intent-context.v1\x00" + expected_bytes).hexdigest()


def test_short_is_the_first_twelve_hex_digits() -> None:
    """short() drops the algorithm prefix and keeps 12 hex digits for timelines."""
    assert short("sha256:250908b2851c897d8d60f7de013e3787655475c09ce9dc1c47fb10dffee634e4") == "250908b2851c"


# --------------------------------------------------------------------------------------------------
# One full sealed envelope
# --------------------------------------------------------------------------------------------------

KAT_TASK = BlobRef("sha256:" + "ab" * 32, 1024, "blob://tasks/1")
KAT_CEILINGS = Ceilings(calls=100, fuel=5000)
KAT_RECORDED_AT = 1_732_867_200_000_000
KAT_ENVELOPE_BYTES = (
    b'{"body":{"ceilings":{"argument_bytes":null,"calls":"100","cost_micros":null,"fuel":"5000",'
    b'"iterations":null,"reserved_fuel":null,"result_bytes":null,"stages":null},"release_id":"rel-2024.11",'
    b'"schema_name":"agent-state","schema_version":"3","task_ref":{"digest":'
    b'"sha256:abababababababababababababababababababababababababababababababab","size":"1024",'
    b'"uri":"blob://tasks/1"},"type":"RunOpened"},"epoch":"0","position":"1","prev_digest":'
    b'"sha256:0000000000000000000000000000000000000000000000000000000000000000",'
    b'"recorded_at":"1732867200000000","run_id":"run-kat","submission_id":"sub-0001","worker":"worker-kat"}\n'
)
KAT_DIGEST = "sha256:250908b2851c897d8d60f7de013e3787655475c09ce9dc1c47fb10dffee634e4"
KAT_SECOND_ENVELOPE_BYTES = (
    b'{"body":{"epoch":"1","expires_at":"1732867230000000","placement":{"capabilities":[],"model":"m",'
    b'"provider":"","region":"","tool_contracts":["shell@1"],"worker":"worker-kat"},"type":"LeaseGranted",'
    b'"worker":"worker-kat"},"epoch":"1","position":"2","prev_digest":'
    b'"sha256:250908b2851c897d8d60f7de013e3787655475c09ce9dc1c47fb10dffee634e4",'
    b'"recorded_at":"1732867200000001","run_id":"run-kat","submission_id":"sub-0002","worker":"worker-kat"}\n'
)
KAT_SECOND_DIGEST = "sha256:bee5861875544c931da544da1b7783486f0a875734922b222ba45753cd68aaa8"


def assert_pinned(recorded: RecordedEvent, envelope_bytes: bytes, digest: str) -> None:
    """The envelope's canonical bytes and digest are the pinned ones, and the two pins vouch for each other."""
    envelope = msgspec.to_builtins(recorded)
    del envelope["digest"]
    assert canonical_bytes(envelope) == envelope_bytes
    assert recorded.digest == digest
    assert "sha256:" + hashlib.sha256(b"baton.event.v1\x00" + envelope_bytes).hexdigest() == digest


def _sealed_run_opened() -> list[RecordedEvent]:
    submission = Submission(
        "sub-0001", "run-kat", "worker-kat", OpenRun("rel-2024.11", "agent-state", 3, KAT_TASK, KAT_CEILINGS)
    )
    body = RunOpened("rel-2024.11", "agent-state", 3, KAT_TASK, KAT_CEILINGS)
    return seal("run-kat", 0, ZERO_DIGEST, submission, 0, [body], KAT_RECORDED_AT)


def test_sealed_run_opened_at_position_one_has_the_pinned_digest() -> None:
    """A RunOpened sealed at position 1 after the zero digest has exactly the pinned envelope bytes and digest."""
    (recorded,) = _sealed_run_opened()

    assert (recorded.position, recorded.prev_digest) == (1, ZERO_DIGEST)
    assert_pinned(recorded, KAT_ENVELOPE_BYTES, KAT_DIGEST)


def test_a_second_event_chains_to_the_pinned_first_digest() -> None:
    """The next envelope quotes the first digest as prev_digest, and the two-event chain verifies to the pin."""
    (first,) = _sealed_run_opened()
    placement = Placement("worker-kat", model="m", tool_contracts=("shell@1",))
    grant = LeaseGranted("worker-kat", 1, placement, KAT_RECORDED_AT + 30_000_000)
    submission = Submission("sub-0002", "run-kat", "worker-kat", OpenRun("x", "y", 1, KAT_TASK))

    (second,) = seal("run-kat", 1, first.digest, submission, 1, [grant], KAT_RECORDED_AT + 1)

    assert second.prev_digest == KAT_DIGEST
    assert_pinned(second, KAT_SECOND_ENVELOPE_BYTES, KAT_SECOND_DIGEST)
    report = verify_chain([msgspec.json.encode(first), msgspec.json.encode(second)], run_id="run-kat")
    assert (report.events, report.head_digest) == (2, second.digest)


def test_the_stored_json_of_the_pinned_event_verifies_as_a_chain() -> None:
    """verify_chain accepts the stored (non-canonical) JSON of the pinned event and reports its digest."""
    report = verify_chain([msgspec.json.encode(e) for e in _sealed_run_opened()], run_id="run-kat")

    assert (report.events, report.head_digest) == (1, KAT_DIGEST)


# --------------------------------------------------------------------------------------------------
# Budgets: checked arithmetic
# --------------------------------------------------------------------------------------------------


def test_max_counter_is_the_bigint_maximum() -> None:
    """Counters are bounded by SQL bigint, 2**63-1."""
    assert MAX_COUNTER == 2**63 - 1 == 9_223_372_036_854_775_807


@pytest.mark.parametrize(("a", "b"), [(0, 0), (1, 2), (MAX_COUNTER, 0), (MAX_COUNTER - 1, 1), (0, MAX_COUNTER)])
def test_checked_add_up_to_the_maximum_is_plain_addition(a: int, b: int) -> None:
    """Sums up to and including 2**63-1 are exact."""
    assert checked_add(a, b) == a + b


@pytest.mark.parametrize(("a", "b"), [(MAX_COUNTER, 1), (1, MAX_COUNTER), (2**62, 2**62), (MAX_COUNTER, MAX_COUNTER)])
def test_checked_add_past_the_maximum_raises_counter_overflow(a: int, b: int) -> None:
    """A sum past 2**63-1 raises CounterOverflow instead of growing or wrapping."""
    with pytest.raises(errors.CounterOverflow) as caught:
        checked_add(a, b, what="fuel")

    assert caught.value.reason == "counter_overflow"


@pytest.mark.parametrize(("a", "b"), [(-1, 0), (0, -1), (-5, 10), (MAX_COUNTER, -1)])
def test_checked_add_of_a_negative_raises_malformed(a: int, b: int) -> None:
    """Counters never go negative, so a negative operand is malformed (not an overflow, not a refund)."""
    with pytest.raises(errors.Malformed) as caught:
        checked_add(a, b)

    assert caught.value.reason == "malformed"


@pytest.mark.parametrize("name", COUNTERS)
def test_usage_plus_overflows_per_counter(name: str) -> None:
    """Usage.plus checks every counter on its own."""
    with pytest.raises(errors.CounterOverflow):
        Usage(**{name: MAX_COUNTER}).plus(Usage(**{name: 1}))


@pytest.mark.parametrize("value", [-1, MAX_COUNTER + 1])
@pytest.mark.parametrize("name", COUNTERS)
def test_usage_and_ceilings_out_of_range_are_malformed(name: str, value: int) -> None:
    """Usage.validate and Ceilings.validate refuse negatives and values past bigint for every counter."""
    with pytest.raises(errors.Malformed):
        Usage(**{name: value}).validate()
    with pytest.raises(errors.Malformed):
        Ceilings(**{name: value}).validate()


def test_ceilings_check_allows_usage_up_to_the_ceiling() -> None:
    """Ceilings are inclusive and None means unbounded."""
    Ceilings(calls=3, fuel=None).check(Usage(calls=3, fuel=MAX_COUNTER))


@pytest.mark.parametrize("name", COUNTERS)
def test_ceilings_check_names_the_exceeded_counter(name: str) -> None:
    """A usage over one ceiling raises BudgetExceeded naming that counter and no other."""
    ceilings = Ceilings(**dict.fromkeys(COUNTERS, 0))

    with pytest.raises(errors.BudgetExceeded) as caught:
        ceilings.check(Usage(**{name: 1}))

    assert caught.value.reason == "budget_exceeded"
    assert [counter for counter in COUNTERS if re.search(rf"\b{counter}\b", caught.value.message)] == [name]


def test_ceilings_check_names_every_exceeded_counter() -> None:
    """When several counters are over, the one error names each of them."""
    ceilings = Ceilings(calls=1, fuel=10, stages=2, cost_micros=100)

    with pytest.raises(errors.BudgetExceeded) as caught:
        ceilings.check(Usage(calls=2, fuel=11, stages=2, cost_micros=101))

    assert [counter for counter in COUNTERS if counter in caught.value.message] == ["calls", "fuel", "cost_micros"]


# --------------------------------------------------------------------------------------------------
# Stages: the whole table of moves
# --------------------------------------------------------------------------------------------------

STAGES = list(Stage)
LEGAL = {
    (Stage.GENERATING, Stage.CANDIDATE_READY),
    (Stage.CANDIDATE_READY, Stage.VERIFYING),
    (Stage.VERIFYING, Stage.VERIFIED),
    (Stage.VERIFIED, Stage.AWAITING_AUTHORITY),
    (Stage.AWAITING_AUTHORITY, Stage.AUTHORIZED),
    (Stage.AUTHORIZED, Stage.COMMITTING),
    (Stage.COMMITTING, Stage.COMMITTED),
    (Stage.COMMITTED, Stage.POSTCONDITION_VERIFIED),
    # rework: back to GENERATING, only before authority is granted
    (Stage.CANDIDATE_READY, Stage.GENERATING),
    (Stage.VERIFYING, Stage.GENERATING),
    (Stage.VERIFIED, Stage.GENERATING),
    (Stage.AWAITING_AUTHORITY, Stage.GENERATING),
}


def test_stage_order_and_spelling_are_pinned() -> None:
    """The boundaries, their order and their stored spelling are part of the log format."""
    assert [stage.value for stage in Stage] == [
        "GENERATING",
        "CANDIDATE_READY",
        "VERIFYING",
        "VERIFIED",
        "AWAITING_AUTHORITY",
        "AUTHORIZED",
        "COMMITTING",
        "COMMITTED",
        "POSTCONDITION_VERIFIED",
    ]
    assert frozenset(target for target, back in LEGAL if back is Stage.GENERATING) == REWORKABLE


@pytest.mark.parametrize("target", STAGES, ids=str)
@pytest.mark.parametrize("current", STAGES, ids=str)
def test_is_legal_for_every_pair(current: Stage, target: Stage) -> None:
    """Forward one step is legal, skipping or staying is not, and rework to GENERATING only from REWORKABLE."""
    assert is_legal(current, target) is ((current, target) in LEGAL)


@pytest.mark.parametrize(("stored", "value"), [("0", 0), ("7", 7), ("-12", -12), (3, 3), ("9" * 30, int("9" * 30))])
def test_schema_integers_read_as_stored_in_either_form(stored: object, value: int) -> None:
    """Given a canonical decimal string (the stored form) or a JSON number (older stores), then the integer."""
    assert schema_integer(stored) == value


@pytest.mark.parametrize("stored", ["+1", " 1", "1 ", "01", "-0", "0_1", "1e0", "1.0", "\u0661", "", True, 1.0, None])
def test_other_spellings_of_a_schema_integer_are_refused(stored: object) -> None:
    """Given a spelling ``int()`` would take but the definition never writes, then ValueError."""
    with pytest.raises(ValueError, match="not a canonical integer"):
        schema_integer(stored)


def test_a_body_stored_before_a_field_was_added_keeps_its_canonical_bytes() -> None:
    """Given bodies as an earlier release stored them (no ``reconciled_by``, ``session``, ``session_gone``,
    no generation-zero ``migration_id``/``from_schema``/``from_version``), when decoded and encoded
    canonically again, then the bytes are the ones their digests were made over."""
    placement = Placement("w", model="m")
    state_ref = {"digest": "sha256:" + "5" * 64, "size": 12, "uri": "handoff:sha256:" + "d" * 64 + "#state"}
    stored = [
        {"type": "IntentReconciled", "op_id": "op-1", "resolution": "applied", "evidence": "log",
         "charge": msgspec.to_builtins(Usage()), "result": None, "result_ref": None},
        {"type": "LeaseGranted", "worker": "w", "epoch": 1, "placement": msgspec.to_builtins(placement),
         "expires_at": 5},
        {"type": "LeaseExpired", "worker": "w", "epoch": 1, "expired_at": 5},
        {"type": "HandoffAccepted", "document_digest": "sha256:" + "d" * 64, "source_epoch": 1,
         "release_id": "rel-1", "schema_name": "coding-agent", "schema_version": 2, "state_ref": state_ref,
         "carried": msgspec.to_builtins(Usage(calls=2)), "ceilings": msgspec.to_builtins(Ceilings(calls=10)),
         "stage": "CANDIDATE_READY", "imported": True, "predecessor_digest": None},
    ]  # fmt: skip
    for plain in stored:
        decoded = msgspec.convert(plain, EVENT_TYPES[plain["type"]])
        assert canonical_bytes(decoded) == canonical_bytes(plain), plain["type"]
