"""Handoff documents: pinned bytes and digest, round trips, and the hostile documents of issue 4.

Given a document (or bytes claiming to be one), when it is encoded, decoded or verified against a
trusted digest, then it round-trips exactly or is refused with a stable reason code. The known-answer
literals were computed once and hard-coded: a change of encoding must fail here first.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baton.domain import errors
from baton.domain.budgets import COUNTERS, MAX_COUNTER, Ceilings, Usage
from baton.domain.credentials import find_credential
from baton.domain.events import Placement
from baton.domain.handoff_document import (
    MAX_DOCUMENT_BYTES,
    MAX_STATE_DEPTH,
    SCHEMA,
    HandoffDocument,
    Migration,
    decode_document,
    document_digest,
    encode_document,
    local_allowance,
    state_digest_of,
    verify_document,
)

from .handoffs import PREDECESSOR, USAGE, checkpoint, document

# --------------------------------------------------------------------------------------------------
# Known answers
# --------------------------------------------------------------------------------------------------

KAT_BYTES = (
    b'{"ceilings":{"argument_bytes":null,"calls":"10","cost_micros":null,"fuel":"100","iterations":null,'
    b'"reserved_fuel":null,"result_bytes":null,"stages":null},"checkpoint":{"authority_context_ref":"sha256:a",'
    b'"budget_ledger_ref":"sha256:b","ceilings":{"argument_bytes":null,"calls":"10","cost_micros":null,'
    b'"fuel":"100","iterations":null,"reserved_fuel":null,"result_bytes":null,"stages":null},'
    b'"checkpoint_hash":"sha256:c","checkpoint_id":"run-kat@7","head_digest":"sha256:h",'
    b'"last_sealed_checkpoint":"run-kat@7","memory_snapshot_ref":null,"observation_manifest_ref":"sha256:o",'
    b'"operation_ledger_ref":"sha256:l","owner":"w-a","owner_epoch":"1","placement":{"capabilities":[],'
    b'"model":"m-1","provider":"","region":"eu","tool_contracts":[],"worker":"w-a"},"position":"7",'
    b'"release_id":"rel-1","run_id":"run-kat","search_state_ref":null,"stage":"CANDIDATE_READY",'
    b'"state_schema_name":"coding-agent","state_schema_version":"1","status":"open",'
    b'"task_state_digest":"sha256:t","task_state_ref":null,"usage":{"argument_bytes":"0","calls":"2",'
    b'"cost_micros":"0","fuel":"30","iterations":"1","reserved_fuel":"0","result_bytes":"0","stages":"3"},'
    b'"verifier_evidence_ref":null,"workspace_snapshot_ref":null},"destination":{"capabilities":[],"model":"m-2",'
    b'"provider":"","region":"us","tool_contracts":["shell@1"],"worker":"w-b"},"destination_worker":"w-b",'
    b'"migration":{"from_schema":"coding-agent","from_version":"1","migration_id":"coding-agent/1-2/attempts",'
    b'"to_schema":"coding-agent","to_version":"2"},'
    b'"predecessor_digest":"sha256:abababababababababababababababababababababababababababababababab",'
    b'"run_id":"run-kat","schema":"baton.handoff.v1","source":{"capabilities":[],"model":"m-1","provider":"",'
    b'"region":"eu","tool_contracts":[],"worker":"w-a"},"source_epoch":"1","source_worker":"w-a",'
    b'"state":{"attempts":1,"candidates":[{"patch":"sha256:p","verdict":"rejected"}],"goal":"fix"},'
    b'"state_digest":"sha256:de7265c3e2c05f85e3ebfeda05fdd62c34b5b757eebb23c9fa571c027e0508c9",'
    b'"state_schema_name":"coding-agent","state_schema_version":"2","usage":{"argument_bytes":"0","calls":"2",'
    b'"cost_micros":"0","fuel":"30","iterations":"1","reserved_fuel":"0","result_bytes":"0","stages":"3"}}\n'
)
KAT_DIGEST = "sha256:f1cbbb89a7e93c461ac190d9bb2a3bcfb29c391b4c9591eb5a6a90e53b4dda00"
KAT_STATE_DIGEST = "sha256:de7265c3e2c05f85e3ebfeda05fdd62c34b5b757eebb23c9fa571c027e0508c9"


def test_the_schema_name_and_size_bound_are_pinned() -> None:
    """The digest prefix is the schema name, and the bound is 1 MiB."""
    assert (SCHEMA, MAX_DOCUMENT_BYTES) == ("baton.handoff.v1", 1_048_576)


def test_the_handoff_reason_codes_are_pinned() -> None:
    """The handoff rejections keep the exact reason codes the bus, the CLI and verdicts map on."""
    classes = [
        errors.NoncanonicalDocument,
        errors.DocumentTooLarge,
        errors.HandoffDigestMismatch,
        errors.InconsistentDocument,
        errors.CredentialInPayload,
        errors.PriorUsageExhaustsDestination,
        errors.MigrationMissing,
    ]

    assert all(issubclass(cls, errors.Rejection) for cls in classes)
    assert [cls.reason for cls in classes] == [
        "noncanonical_document",
        "document_too_large",
        "digest_mismatch",
        "inconsistent_document",
        "credential_in_payload",
        "prior_usage_exhausts_destination",
        "migration_missing",
    ]
    assert errors.HandoffDigestMismatch.reason == errors.ChainBroken.reason


def test_a_small_document_encodes_to_the_pinned_bytes_and_digest() -> None:
    """The pinned document has exactly the pinned canonical bytes, state digest and document digest."""
    doc = document()

    data = encode_document(doc)

    assert data == KAT_BYTES
    assert doc.state_digest == KAT_STATE_DIGEST
    assert document_digest(data) == KAT_DIGEST


def test_the_pinned_digests_follow_their_definitions() -> None:
    """Document digest = SHA-256(schema, 0x00, 8-byte big-endian length, bytes); state digest is prefixed too."""
    header = b"baton.handoff.v1\x00" + len(KAT_BYTES).to_bytes(8, "big")
    state_bytes = b'{"attempts":1,"candidates":[{"patch":"sha256:p","verdict":"rejected"}],"goal":"fix"}\n'

    assert "sha256:" + hashlib.sha256(header + KAT_BYTES).hexdigest() == KAT_DIGEST
    assert "sha256:" + hashlib.sha256(b"baton.task-state.v1\x00" + state_bytes).hexdigest() == KAT_STATE_DIGEST


def test_the_length_is_part_of_the_digest() -> None:
    """The same bytes hashed without the length header give another digest."""
    assert "sha256:" + hashlib.sha256(b"baton.handoff.v1\x00" + KAT_BYTES).hexdigest() != KAT_DIGEST


def test_the_pinned_bytes_decode_and_verify_to_the_pinned_document() -> None:
    """Given the pinned bytes and digest from a trusted channel, verify_document returns the document."""
    assert verify_document(KAT_BYTES, KAT_DIGEST) == decode_document(KAT_BYTES) == document()


# --------------------------------------------------------------------------------------------------
# Round trips
# --------------------------------------------------------------------------------------------------


def test_an_identity_handoff_without_predecessor_round_trips() -> None:
    """A first handoff (no predecessor) with no schema change decodes to the document encoded."""
    state = {"goal": "fix", "big": MAX_COUNTER, "neg": -(2**63), "flags": [True, False, None]}
    doc = document(
        state=state,
        state_digest=state_digest_of(state),
        state_schema_version=1,
        migration=Migration.identity("coding-agent", 1),
        predecessor_digest=None,
    )

    assert decode_document(encode_document(doc)) == doc


def test_a_chain_binds_the_predecessor_digest() -> None:
    """B's document carries the digest of A's document bytes, and reads back the same."""
    first = encode_document(document(predecessor_digest=None))

    second = decode_document(encode_document(document(predecessor_digest=document_digest(first))))

    assert second.predecessor_digest == document_digest(first)


def test_a_document_of_exactly_the_bound_is_accepted() -> None:
    """A canonical document of exactly 1 MiB decodes; the bound is inclusive."""
    base = len(encode_document(_padded(0)))

    data = encode_document(_padded(MAX_DOCUMENT_BYTES - base))

    assert len(data) == MAX_DOCUMENT_BYTES
    assert decode_document(data).state["pad"] == "x" * (MAX_DOCUMENT_BYTES - base)


def _padded(n: int) -> HandoffDocument:
    state = {"pad": "x" * n}
    return document(
        state=state,
        state_digest=state_digest_of(state),
        state_schema_version=1,
        migration=Migration.identity("coding-agent", 1),
    )


# --------------------------------------------------------------------------------------------------
# Hostile documents
# --------------------------------------------------------------------------------------------------


def _swap(old: bytes, new: bytes, data: bytes = KAT_BYTES) -> bytes:
    assert data.count(old) == 1, old
    return data.replace(old, new)


HOSTILE_NONCANONICAL = {
    "extra_key": KAT_BYTES[:-2] + b',"zzz":"1"}\n',
    "extra_key_in_checkpoint": _swap(b'"workspace_snapshot_ref":null}', b'"workspace_snapshot_ref":null,"x":"1"}'),
    "duplicate_key": _swap(b'"run_id":"run-kat","schema"', b'"run_id":"run-kat","run_id":"run-kat","schema"'),
    "leading_zero": _swap(b'"source_epoch":"1"', b'"source_epoch":"01"'),
    "plus_sign": _swap(b'"source_epoch":"1"', b'"source_epoch":"+1"'),
    "negative_counter": _swap(b'"position":"7"', b'"position":"-7"'),
    "counter_past_bigint": _swap(b'"position":"7"', b'"position":"9223372036854775808"'),
    "json_number_for_counter": _swap(b'"source_epoch":"1"', b'"source_epoch":1'),
    "exponent_for_counter": _swap(b'"source_epoch":"1"', b'"source_epoch":"1e0"'),
    "float_in_state": _swap(b'"attempts":1,', b'"attempts":1.0,'),
    "state_int_past_64_bits": _swap(b'"attempts":1,', b'"attempts":9223372036854775808,'),
    "escaped_letter": _swap(b'"goal":"fix"', b'"goal":"\\u0066ix"'),
    "space_after_comma": _swap(b'"run_id":"run-kat","schema"', b'"run_id":"run-kat", "schema"'),
    "space_after_colon": _swap(b'"run_id":"run-kat","schema"', b'"run_id": "run-kat","schema"'),
    "leading_space": b" " + KAT_BYTES,
    "pretty_printed": msgspec.json.format(KAT_BYTES, indent=2),
    "crlf": KAT_BYTES[:-1] + b"\r\n",
    "two_newlines": KAT_BYTES + b"\n",
    "no_newline": KAT_BYTES[:-1],
    "truncated_half": KAT_BYTES[: len(KAT_BYTES) // 2],
    "truncated_to_one_byte": KAT_BYTES[:1],
    "empty": b"",
    "unsorted_keys": b'{"usage"' + KAT_BYTES[1:].replace(b',"usage"', b""),
    "other_schema": _swap(b'"baton.handoff.v1"', b'"baton.handoff.v2"'),
    "not_utf8": _swap(b'"goal":"fix"', b'"goal":"\xff"'),
    "lone_surrogate_escape": _swap(b'"goal":"fix"', b'"goal":"\\ud800"'),
    "array_not_object": b"[]\n",
}


@pytest.mark.parametrize("data", HOSTILE_NONCANONICAL.values(), ids=HOSTILE_NONCANONICAL.keys())
def test_hostile_bytes_are_rejected_as_noncanonical(data: bytes) -> None:
    """Given bytes that are not exactly a canonical document, decode_document refuses noncanonical_document."""
    with pytest.raises(errors.NoncanonicalDocument) as caught:
        decode_document(data)

    assert caught.value.reason == "noncanonical_document"


@pytest.mark.parametrize("data", HOSTILE_NONCANONICAL.values(), ids=HOSTILE_NONCANONICAL.keys())
def test_hostile_bytes_never_verify_against_the_trusted_digest(data: bytes) -> None:
    """Given any altered bytes and the original digest, verify_document refuses digest_mismatch before parsing."""
    with pytest.raises(errors.HandoffDigestMismatch) as caught:
        verify_document(data, KAT_DIGEST)

    assert caught.value.reason == "digest_mismatch"


HOSTILE_INCONSISTENT = {
    "altered_usage": _swap(b'"stages":"3"}}\n', b'"stages":"4"}}\n'),
    "altered_state": _swap(b'"goal":"fix"', b'"goal":"fox"'),
    "altered_epoch": _swap(b'"source_epoch":"1"', b'"source_epoch":"2"'),
    "altered_ceilings": _swap(
        b'"fuel":"100","iterations":null,"reserved_fuel":null,"result_bytes":null,"stages":null},"checkpoint"',
        b'"fuel":"101","iterations":null,"reserved_fuel":null,"result_bytes":null,"stages":null},"checkpoint"',
    ),
    "altered_destination_worker": _swap(b'"destination_worker":"w-b"', b'"destination_worker":"w-c"'),
    "altered_migration_target": _swap(b'"state_schema_version":"2"', b'"state_schema_version":"3"'),
    "malformed_predecessor": _swap(PREDECESSOR.encode(), PREDECESSOR.upper().encode()),
}


@pytest.mark.parametrize("data", HOSTILE_INCONSISTENT.values(), ids=HOSTILE_INCONSISTENT.keys())
def test_a_canonical_document_contradicting_itself_is_rejected(data: bytes) -> None:
    """Given canonical bytes whose fields disagree (usage vs checkpoint, state vs state_digest...), decode refuses."""
    with pytest.raises(errors.InconsistentDocument) as caught:
        decode_document(data)

    assert caught.value.reason == "inconsistent_document"
    with pytest.raises(errors.HandoffDigestMismatch):
        verify_document(data, KAT_DIGEST)


def test_a_self_consistent_forgery_is_caught_only_by_the_trusted_digest() -> None:
    """Usage altered everywhere it is bound decodes on its own, but never verifies against the trusted digest."""
    forged = KAT_BYTES.replace(b'"stages":"3"}', b'"stages":"0"}')
    assert forged.count(b'"stages":"0"}') == 2

    assert decode_document(forged).usage.stages == 0
    with pytest.raises(errors.HandoffDigestMismatch):
        verify_document(forged, KAT_DIGEST)
    assert verify_document(forged, document_digest(forged)).usage.stages == 0


@pytest.mark.parametrize("size", [MAX_DOCUMENT_BYTES + 1, 2 * MAX_DOCUMENT_BYTES])
def test_oversize_bytes_are_refused_before_parsing(size: int) -> None:
    """Bytes past 1 MiB are refused as document_too_large even when they are not JSON at all."""
    data = b"\xff" * size

    for check in (decode_document, lambda d: verify_document(d, document_digest(d))):
        with pytest.raises(errors.DocumentTooLarge) as caught:
            check(data)
        assert caught.value.reason == "document_too_large"


def test_a_canonical_document_one_byte_over_the_bound_is_refused() -> None:
    """A document one byte past 1 MiB is refused on encode's output size by decode."""
    data = encode_document(_padded(MAX_DOCUMENT_BYTES - len(encode_document(_padded(0))) + 1))

    with pytest.raises(errors.DocumentTooLarge):
        decode_document(data)


@pytest.mark.parametrize(
    "expected",
    [KAT_DIGEST.upper(), KAT_DIGEST[:-1], "sha512:" + KAT_DIGEST[7:], ""],
    ids=["upper", "short", "algo", "empty"],
)
def test_a_malformed_expected_digest_is_malformed(expected: str) -> None:
    """The trusted digest must itself be 'sha256:' + 64 lowercase hex digits, or the call is malformed."""
    with pytest.raises(errors.Malformed):
        verify_document(KAT_BYTES, expected)


def test_a_wrong_digest_is_a_digest_mismatch() -> None:
    """Given the pinned bytes and another well-formed digest, verify_document refuses digest_mismatch."""
    with pytest.raises(errors.HandoffDigestMismatch) as caught:
        verify_document(KAT_BYTES, "sha256:" + "0" * 64)

    assert caught.value.reason == "digest_mismatch"


def test_a_state_nested_too_deep_is_refused() -> None:
    """A state nested past MAX_STATE_DEPTH has no canonical form; one level less is fine."""

    def nested(depth: int) -> dict[str, Any]:
        value: dict[str, Any] = {}
        for _ in range(depth - 1):
            value = {"k": value}
        return value

    ok = nested(MAX_STATE_DEPTH)
    decode_document(encode_document(document(state=ok, state_digest=state_digest_of(ok), **_IDENTITY)))
    with pytest.raises(errors.NoncanonicalDocument):
        state_digest_of(nested(MAX_STATE_DEPTH + 1))
    deep = b'{"a":' * 2000 + b"{}" + b"}" * 2000
    with pytest.raises(errors.NoncanonicalDocument):
        decode_document(_swap(b'"goal":"fix"', b'"goal":' + deep))


_IDENTITY: dict[str, Any] = {"state_schema_version": 1, "migration": Migration.identity("coding-agent", 1)}

INCONSISTENT_DOCUMENTS = {
    "run_id": {"run_id": "run-other"},
    "usage": {"usage": Usage(calls=3, fuel=30, iterations=1, stages=3)},
    "ceilings": {"ceilings": Ceilings(calls=10)},
    "source_epoch": {"source_epoch": 2},
    "source_worker_vs_owner": {"source_worker": "w-x", "source": Placement("w-x")},
    "source_vs_checkpoint_placement": {"source": Placement("w-a", model="other")},
    "source_placement_worker": {"source": Placement("w-x", model="m-1", region="eu")},
    "destination_placement_worker": {"destination": Placement("w-x")},
    "migration_from": {"migration": Migration("coding-agent", 0, "coding-agent", 2, "m")},
    "migration_to": {"migration": Migration("coding-agent", 1, "coding-agent", 3, "m")},
    "identity_id_with_a_change": {"migration": Migration("coding-agent", 1, "coding-agent", 2, "identity")},
    "change_id_without_a_change": {
        "state_schema_version": 1,
        "migration": Migration("coding-agent", 1, "coding-agent", 1, "m"),
    },
    "state_digest": {"state_digest": "sha256:" + "0" * 64},
    "state_digest_spelling": {"state_digest": KAT_STATE_DIGEST.upper()},
    "predecessor_spelling": {"predecessor_digest": "sha256:abc"},
}


@pytest.mark.parametrize("changes", INCONSISTENT_DOCUMENTS.values(), ids=INCONSISTENT_DOCUMENTS.keys())
def test_an_inconsistent_document_cannot_even_be_encoded(changes: dict[str, Any]) -> None:
    """encode_document refuses a document whose fields contradict each other with inconsistent_document."""
    with pytest.raises(errors.InconsistentDocument):
        encode_document(document(**changes))


def test_an_unowned_checkpoint_accepts_any_source_worker() -> None:
    """After the source's lease expired (no owner, no placement bound) the source worker is not contradicted."""
    doc = document(checkpoint=checkpoint(owner=None, placement=None), source=Placement("w-x"), source_worker="w-x")

    assert decode_document(encode_document(doc)) == doc


@pytest.mark.parametrize(
    "changes",
    [
        {"source_epoch": -1, "checkpoint": checkpoint(owner_epoch=-1)},
        {"usage": Usage(calls=-1), "checkpoint": checkpoint(usage=Usage(calls=-1))},
        {"ceilings": Ceilings(fuel=MAX_COUNTER + 1), "checkpoint": checkpoint(ceilings=Ceilings(fuel=MAX_COUNTER + 1))},
        {"state": {"x": 1.5}},
        {"state": {"x": 2**64}},
        {"state": {"x": {1, 2}}},
        {"state": {"x": "\ud800"}},
        {"schema": "baton.handoff.v0"},
        {"state": {1: "x"}},
    ],
    ids=[
        "negative_epoch",
        "negative_usage",
        "ceiling_past_bigint",
        "float",
        "int_past_64_bits",
        "set",
        "surrogate",
        "int_key",
        "other_schema",
    ],
)
def test_values_without_canonical_spelling_cannot_be_encoded(changes: dict[str, Any]) -> None:
    """encode_document refuses signs, out-of-range counters, floats and non-JSON values as noncanonical."""
    with pytest.raises(errors.NoncanonicalDocument):
        encode_document(document(**changes))


def test_a_credential_in_the_state_is_refused_both_ways() -> None:
    """A state carrying a credential cannot be encoded, and canonical bytes carrying one do not decode."""
    key = "AKIA" + "Z7Q2" * 4
    state = {**document().state, "note": f"use {key}"}
    with pytest.raises(errors.CredentialInPayload) as caught:
        encode_document(document(state=state, state_digest=state_digest_of(state)))
    assert caught.value.reason == "credential_in_payload"
    assert key not in caught.value.message

    data = _swap(b'"goal":"fix"', b'"goal":"fix","note":"use ' + key.encode() + b'"')
    data = _swap(KAT_STATE_DIGEST.encode(), state_digest_of(state).encode(), data)
    with pytest.raises(errors.CredentialInPayload):
        decode_document(data)


# --------------------------------------------------------------------------------------------------
# Budgets carried across the handoff
# --------------------------------------------------------------------------------------------------


def test_local_allowance_is_ceiling_minus_carried_and_unbounded_stays_unbounded() -> None:
    """The destination may spend what is left under each ceiling; reported usage is carried plus local."""
    allowance = local_allowance(Ceilings(calls=10, fuel=100, stages=5), USAGE)

    assert allowance == Ceilings(calls=8, fuel=70, stages=2)
    assert USAGE.plus(Usage(calls=8, fuel=70, stages=2)).calls == 10


@pytest.mark.parametrize("name", COUNTERS)
def test_carried_usage_reaching_a_ceiling_exhausts_the_destination(name: str) -> None:
    """Carried usage equal to a non-zero ceiling leaves nothing: prior_usage_exhausts_destination names it."""
    with pytest.raises(errors.PriorUsageExhaustsDestination) as caught:
        local_allowance(Ceilings(**{name: 5}), Usage(**{name: 5}))

    assert caught.value.reason == "prior_usage_exhausts_destination"
    assert name in caught.value.message


def test_carried_usage_past_ceilings_names_every_counter() -> None:
    """Every counter at or past its ceiling is named in the one error."""
    with pytest.raises(errors.PriorUsageExhaustsDestination) as caught:
        local_allowance(Ceilings(calls=1, fuel=10, stages=9), Usage(calls=2, fuel=10, stages=1))

    assert [name for name in COUNTERS if name in caught.value.message] == ["calls", "fuel"]


def test_an_unused_zero_ceiling_is_not_exhausted_by_prior_usage() -> None:
    """A ceiling of 0 with nothing carried stays a zero allowance: the run always had that limit."""
    assert local_allowance(Ceilings(cost_micros=0, calls=3), Usage(calls=1)) == Ceilings(cost_micros=0, calls=2)


def test_local_allowance_refuses_out_of_range_inputs() -> None:
    """Negative carried usage is malformed, never a larger allowance."""
    with pytest.raises(errors.Malformed):
        local_allowance(Ceilings(calls=3), Usage(calls=-1))


# --------------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------------

_text = st.text(max_size=12)
_ints = st.integers(0, MAX_COUNTER)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=20,
)
_usage = st.builds(Usage, *[_ints] * len(COUNTERS))
_ceilings = st.builds(Ceilings, *[st.none() | _ints] * len(COUNTERS))
_placement = st.builds(
    Placement,
    _text,
    _text,
    _text,
    _text,
    st.lists(_text, max_size=3).map(tuple),
    st.lists(_text, max_size=3).map(tuple),
)
_digest = st.binary(min_size=32, max_size=32).map(lambda b: "sha256:" + b.hex())


@st.composite
def documents(draw: st.DrawFn) -> HandoffDocument:
    """Random consistent documents: any counters, any JSON state without credentials, any placements."""
    state = draw(st.dictionaries(_text, _json, max_size=5))
    source, destination = draw(_placement), draw(_placement)
    usage, ceilings, epoch = draw(_usage), draw(_ceilings), draw(_ints)
    name, version, target = draw(_text), draw(_ints), draw(_ints)
    migration = Migration.identity(name, version) if version == target else Migration(name, version, name, target, "m")
    point = checkpoint(
        run_id=draw(_text),
        position=draw(_ints),
        state_schema_name=name,
        state_schema_version=version,
        usage=usage,
        ceilings=ceilings,
        owner_epoch=epoch,
        owner=draw(st.none() | st.just(source.worker)),
        placement=draw(st.none() | st.just(source)),
    )
    doc = HandoffDocument(
        run_id=point.run_id,
        checkpoint=point,
        state_schema_name=name,
        state_schema_version=target,
        state=state,
        state_digest=state_digest_of(state),
        usage=usage,
        ceilings=ceilings,
        migration=migration,
        predecessor_digest=draw(st.none() | _digest),
        source=source,
        destination=destination,
        source_epoch=epoch,
        source_worker=source.worker,
        destination_worker=destination.worker,
    )
    if find_credential(msgspec.to_builtins(doc)) is not None:
        return draw(st.nothing())
    return doc


@settings(deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(documents())
def test_every_document_round_trips_byte_for_byte(doc: HandoffDocument) -> None:
    """For any valid document, decode(encode(doc)) == doc and the bytes re-encode identically."""
    data = encode_document(doc)

    assert decode_document(data) == doc
    assert encode_document(decode_document(data)) == data
    assert data.endswith(b"}\n") and not data.endswith(b"\n\n")


@settings(deadline=None, max_examples=200)
@given(st.integers(0, len(KAT_BYTES) - 1), st.integers(0, 255))
def test_no_single_byte_change_verifies_against_the_trusted_digest(index: int, byte: int) -> None:
    """Any one-byte change of the pinned document is refused by verify_document with the pinned digest."""
    if KAT_BYTES[index] == byte:
        byte ^= 1
    data = KAT_BYTES[:index] + bytes([byte]) + KAT_BYTES[index + 1 :]

    with pytest.raises(errors.HandoffDigestMismatch):
        verify_document(data, KAT_DIGEST)


# --------------------------------------------------------------------------------------------------
# The published schema
# --------------------------------------------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[3] / "docs" / "handoff.md"


def _without_descriptions(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_descriptions(v) for k, v in value.items() if k != "description"}
    if isinstance(value, list):
        return [_without_descriptions(v) for v in value]
    return value


def test_the_json_schema_in_the_docs_matches_the_code() -> None:
    """docs/handoff.md publishes msgspec's JSON Schema of HandoffDocument (descriptions aside) and the pinned vector."""
    text = DOCS.read_text(encoding="utf-8")
    published = text.split("### JSON Schema", 1)[1].split("```json\n", 1)[1].split("```", 1)[0]
    generated = json.loads(msgspec.json.encode(msgspec.json.schema(HandoffDocument)))  # as JSON: tuples are arrays

    assert _without_descriptions(json.loads(published)) == _without_descriptions(generated)
    assert KAT_BYTES.decode() in text
    assert KAT_DIGEST in text
