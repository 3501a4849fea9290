"""The audit's fast path for the stored form: what the ledger writes proves itself; any other spelling under a
digest of its own goes the reference way, so the audit never passes what ``verify_chain`` refuses."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given as hypothesis_given
from hypothesis import settings
from hypothesis import strategies as st

from domain.canonical import digest_of
from domain.chain import EVENT_PREFIX, hashed_part, seal_stored, stored_bytes, stored_form, verify_chain
from domain.commands import RenewLease, Submission
from domain.errors import ChainBroken
from domain.events import RecordedEvent
from domain.stages import Stage
from projections.audit import AuditFold, audit_stored

from ..domain.given import RUN, W1, given
from ..domain.test_canonical_differential import EVERY_BODY

_lenient = msgspec.json.Decoder(RecordedEvent, strict=False)


@settings(max_examples=400, deadline=None)
@hypothesis_given(st.lists(EVERY_BODY, min_size=1, max_size=3))
def test_what_the_ledger_stores_takes_the_fast_path(bodies: list[Any]) -> None:
    """Given sealed envelopes of any event type, when their stored form is checked, then it proves itself."""
    submission = Submission("s-1", "run-é", "w-1", RenewLease(ttl_ms=1))
    for event, stored in seal_stored("run-é", 4, "sha256:" + "0" * 64, submission, 3, bodies, 7):
        assert AuditFold("run-é")._verified(stored) == event


def history_stored() -> list[bytes]:
    """Opened (with ceilings), leased, intent, observation, transition: the stored form of positions 1..5."""
    history = given().opened().leased(W1).intended("op-1").observed("op-1")
    history.moved_to(Stage.CANDIDATE_READY)
    return [stored_bytes(event) for event in history.log]


def self_digested(stored: bytes, old: bytes, new: bytes) -> bytes:
    """``stored`` with ``old`` replaced by ``new`` in its hashed bytes, and a digest of its own over them."""
    split = hashed_part(stored)
    assert split is not None and old in split[0]
    hashed = split[0].replace(old, new, 1)
    return stored_form(hashed, digest_of(EVENT_PREFIX, hashed))


@pytest.mark.parametrize(
    ("position", "old", "new", "code"),
    [
        (5, b'"epoch":"1"', b'"epoch":1', "digest_mismatch"),  # a bare number: not the definition's bytes
        (5, b'"epoch":"1"', b'"epoch":"1e0"', "noncanonical"),  # reads as 1, hashes as a string
        (5, b'"epoch":"1"', b'"epoch":"1.0"', "noncanonical"),
        (5, b',"epoch":"1"', b', "epoch":"1"', "digest_mismatch"),  # whitespace
        (5, b'"epoch":"1"', b'"epoch":"2","epoch":"1"', "digest_mismatch"),  # a duplicate key
        (5, b'"worker":"', b'"worke\\u0072":"', "digest_mismatch"),  # an escape the definition does not write
        (4, b'"result":null', b'"result":{"f":1.5}', "digest_mismatch"),  # a float: no canonical bytes
        (1, b'"calls":null', b'"calls":"null"', "noncanonical"),  # reads as an absent ceiling
    ],
)
def test_a_self_digested_spelling_is_found_where_verify_chain_would(
    position: int, old: bytes, new: bytes, code: str
) -> None:
    """Given an event re-spelled with a digest over its new bytes (and the log cut after it), when audited,
    then the problem is named at that position; where the definition's digest differs, verify_chain fails too."""
    stored = history_stored()[:position]
    stored[-1] = self_digested(stored[-1], old, new)
    assert AuditFold(RUN)._verified(stored[-1]) is None  # the reference path decides

    problems = audit_stored(RUN, stored)

    assert (position, code) in {(p.position, p.code) for p in problems}
    if code == "digest_mismatch":
        with pytest.raises(ChainBroken):
            verify_chain(stored, run_id=RUN)


def test_the_canonical_stored_history_audits_clean_on_the_fast_path() -> None:
    """Given the stored form of a valid history, when audited, then no problem and every event is canonical."""
    stored = history_stored()
    assert audit_stored(RUN, stored) == []
    assert all(AuditFold(RUN)._verified(data) is not None for data in stored)
