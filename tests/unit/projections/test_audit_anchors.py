"""The store's rows and an export's head statement, compared with what the log gives (pure)."""

from __future__ import annotations

from baton.domain.export_head import HEAD_PREFIX, HeadStatement, StreamHead, signed_bytes, statement_line
from baton.projections.audit_anchors import LastSubmission, RowClaims, check_rows, stated_heads
from baton.projections.audit_state import AuditState

D = "sha256:" + "d" * 64
E = "sha256:" + "e" * 64


def statement(*heads: StreamHead) -> HeadStatement:
    return HeadStatement("store-x", "ed25519:k", 1, "run", heads, signature="c2ln")


def found(state: AuditState) -> list[tuple[int, str]]:
    return [(p.position, p.code) for p in state.problems]


def test_each_stream_must_end_exactly_at_its_stated_head() -> None:
    """Given stated heads, then a short run is tail_cut at its first missing position, a longer one or one on
    another digest head_mismatch, an unstated run head_unstated, and a stated run absent from the file tail_cut."""
    stated = statement(StreamHead("a", 5, D), StreamHead("b", 5, D), StreamHead("c", 5, D), StreamHead("gone", 2, D))
    problems = stated_heads(stated, [("a", 3, D), ("b", 6, D), ("c", 5, E), ("extra", 1, D)])
    assert [(p.run_id, p.position, p.code) for p in problems] == [
        ("a", 4, "tail_cut"),
        ("b", 6, "head_mismatch"),
        ("c", 5, "head_mismatch"),
        ("extra", 1, "head_unstated"),
        ("gone", 1, "tail_cut"),
    ]
    assert stated_heads(stated, [("a", 5, D), ("b", 5, D), ("c", 5, D), ("gone", 2, D)]) == []


def test_the_signature_covers_everything_but_itself_under_its_own_prefix() -> None:
    """Given a statement, then its signed bytes are the prefix and its canonical form without the signature,
    the same whatever the signature, and its line carries the signature and the statement tag."""
    plain = statement(StreamHead("a", 5, D))
    other = HeadStatement("store-x", "ed25519:k", 1, "run", plain.heads, signature="b3RoZXI=")
    assert signed_bytes(plain) == signed_bytes(other)
    assert signed_bytes(plain).startswith(HEAD_PREFIX)
    assert b"signature" not in signed_bytes(plain)
    assert b'"position":"5"' in signed_bytes(plain)  # schema integers as decimal strings, as everywhere
    assert b'"statement":"baton.export-head.v1"' in statement_line(plain)
    assert b'"signature":"c2ln"' in statement_line(plain)


def test_the_last_submission_row_must_sit_at_the_head_and_name_its_submission() -> None:
    """Given a log ending at 5 from submission s5, then a last row at 7 is submission_past_head at 6, one at 4 or
    none submission_mismatch after it, one at 5 for another submission submission_mismatch at 5."""
    cases = [
        (LastSubmission("s7", 7), [(6, "submission_past_head")]),
        (LastSubmission("s4", 4), [(5, "submission_mismatch")]),
        (None, [(1, "submission_mismatch")]),
        (LastSubmission("s9", 5), [(5, "submission_mismatch")]),
        (LastSubmission("s5", 5), []),
    ]
    for last, expected in cases:
        state = AuditState("r")
        check_rows(state, 5, "s5", None, last)
        assert found(state) == expected, last


def test_the_run_rows_other_columns_must_be_what_the_log_gives() -> None:
    """Given a fresh run's log (epoch 0, no lease, GENERATING, open), then a row that differs is run_row_mismatch
    at the head naming each field, and an equal row is no problem."""
    state = AuditState("r")
    check_rows(state, 3, "s3", RowClaims(0, None, None, "GENERATING", "open"), LastSubmission("s3", 3))
    assert found(state) == []
    check_rows(state, 3, "s3", RowClaims(2, "w", 9, "VERIFYING", "completed"), LastSubmission("s3", 3))
    assert found(state) == [(3, "run_row_mismatch")]
    assert all(
        name in state.problems[0].detail for name in ("epoch 2", "holder 'w'", "expires_at 9", "stage", "status")
    )
