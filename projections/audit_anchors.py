"""What others recorded about a run's log, compared with the log: the store's rows, an export's statement.

The events are the truth, and everything written beside them must agree with them, so that an
edit of the log has to fix every record of it or be found. In a store, every append writes, in the
same transaction, the run row (its head and the state the fence compares: epoch, holder, lease
expiry, stage, status) and one submission row per accepted submission, at the position of that
submission's last event. A tail cut from the events with the run row's head "fixed up" still
leaves the dropped submissions' rows pointing past the head (``submission_past_head``) and often a
row whose epoch, holder or stage the log no longer gives (``run_row_mismatch``); events added
behind the ledger after its last submission have no row (``submission_mismatch``).

An export carries no rows; its anchor is the head statement the store signed
(``domain.export_head``): each exported stream must end exactly at its stated head.

Pure comparisons: the adapters read the rows and verify the statement's signature, and hand over
what they read; the audit fold supplies what the log says.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from baton.domain.export_head import HeadStatement
from baton.projections.audit_state import AuditState, Problem

__all__ = ["LastSubmission", "RowClaims", "check_rows", "stated_heads"]


class RowClaims(msgspec.Struct, frozen=True):
    """The run row's columns beside its head: what the ledger's fold of the log gave at the last append."""

    epoch: int
    holder: str | None
    expires_at: int | None
    stage: str
    status: str


class LastSubmission(msgspec.Struct, frozen=True):
    """The run's submission row with the highest position: the last submission the ledger accepted."""

    submission_id: str
    position: int


def check_rows(
    s: AuditState,
    head: int,
    head_submission: str | None,
    row: RowClaims | None,
    last: LastSubmission | None,
) -> None:
    """Compare the run's rows with the log that ends at ``head`` (its event from ``head_submission``).

    ``row`` is compared only when the run row's head already agrees with the log (the caller checks
    it: otherwise ``head_mismatch`` says more). ``last`` is None when the run has no submission row.
    """
    if last is not None and last.position > head:
        s.report(
            "submission_past_head",
            f"submission {last.submission_id!r} is recorded at position {last.position}; the log ends at {head}",
            head + 1,
        )
    elif head and (last is None or last.position < head):
        after = last.position if last is not None else 0
        s.report(
            "submission_mismatch",
            f"events {after + 1}..{head} were recorded by no submission the ledger accepted "
            f"(its last submission row is at {after})",
            after + 1,
        )
    elif last is not None and head and last.submission_id != head_submission:
        s.report(
            "submission_mismatch",
            f"the event at {head} is from submission {head_submission!r}; "
            f"the submission row at {head} is {last.submission_id!r}",
            head,
        )
    if row is not None:
        _compare_row(s, head, row)


def _compare_row(s: AuditState, head: int, row: RowClaims) -> None:
    lease = s.lease
    ended = s.terminal is not None
    checks = (
        ("epoch", row.epoch, s.epoch, row.epoch == s.epoch),
        ("holder", row.holder, lease.worker if lease else None, row.holder == (lease.worker if lease else None)),
        (
            "expires_at",
            row.expires_at,
            lease.expires_at if lease else None,
            row.expires_at == (lease.expires_at if lease else None),
        ),
        ("stage", row.stage, str(s.stage), row.stage == str(s.stage)),
        # the audit tells an ended run from an open one; which end, the rules of RunCompleted/RunFailed check
        ("status", row.status, "ended" if ended else "open", (row.status != "open") == ended),
    )
    differ = [f"{name} {recorded!r} (the log: {logged!r})" for name, recorded, logged, agree in checks if not agree]
    if differ:
        s.report("run_row_mismatch", "the run row records " + ", ".join(differ), max(head, 1))


def stated_heads(statement: HeadStatement, found: Iterable[tuple[str, int, str | None]]) -> list[Problem]:
    """Each exported stream against the head the statement gives it: ``found`` is, per stream in the
    file, its run id, last position and last digest (None after an undecodable event)."""
    stated = {head.run_id: head for head in statement.heads}
    problems: list[Problem] = []
    for run_id, position, digest in found:
        head = stated.pop(run_id, None)
        if head is None:
            detail = "the head statement names no head for this run: its events were added to the export"
            problems.append(Problem(run_id, 1, "head_unstated", detail))
        elif position < head.position:
            detail = f"the export ends at {position}; the store stated head {head.position} ({head.digest})"
            problems.append(Problem(run_id, position + 1, "tail_cut", detail))
        elif position > head.position or digest != head.digest:
            detail = f"the export ends at {position} ({digest}); the store stated head {head.position} ({head.digest})"
            problems.append(Problem(run_id, min(position, head.position + 1), "head_mismatch", detail))
    for head in stated.values():
        detail = f"no event of this run is in the export; the store stated head {head.position} ({head.digest})"
        problems.append(Problem(head.run_id, 1, "tail_cut", detail))
    return problems
