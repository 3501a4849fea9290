"""Submission content digests: given a submission, when digested, then the form rows get; a retry matches
a row of either form (the earlier releases' positional form is pinned by answers their code computed)."""

from __future__ import annotations

import msgspec
import pytest

from baton.adapters.eventstore.content_digest import positional_digest, same_content, submission_digest
from baton.domain.budgets import Ceilings
from baton.domain.commands import OpenRun, RecordIntent, Submission
from baton.domain.events import BlobRef, IntentContext

INTENT = Submission(
    "s-7",
    "run-1",
    "worker-a",
    RecordIntent("op-1", "pure", "tools.search@1", IntentContext(3, "search", arguments={"query": "q", "n": 1}), "k"),
    1,
)
OPEN = Submission(
    "s-1", "run-1", "sup", OpenRun("rel-1", "agent-state", 1, BlobRef("sha256:ab", 5, "blob://x"), Ceilings(calls=10))
)


@pytest.mark.parametrize(
    ("submission", "first", "positional"),
    [
        (
            INTENT,
            "sha256:403553f62c3537586b4abb1e738faf700aaf3bff1b51db0cc307234d85d299d2",
            "sha256:e18995a8a1df6d9e2576246076525ec0bf7bd1c021f130635817aac3d30df583",
        ),
        (
            OPEN,
            "sha256:03bce35c8ca0d17273ff3470cc7c27334f984477d8bb589383a42d4640588017",
            "sha256:caa221c206b7d0d695a1523429d0ff59c16da61af3bcc9075b51772ff9ba2bff",
        ),
    ],
    ids=["intent", "open"],
)
def test_both_forms_have_their_known_answers(submission: Submission, first: str, positional: str) -> None:
    """The digest rows get, and the positional form earlier releases wrote, are pinned byte for byte."""
    assert submission_digest(submission) == first
    assert positional_digest(submission) == positional


def test_a_retry_matches_a_row_of_either_form_and_other_content_matches_neither() -> None:
    """Given rows in each form, when the same submission is compared, then a match; other content, none."""
    other = msgspec.structs.replace(INTENT, epoch=2)
    for row in (submission_digest(INTENT), positional_digest(INTENT)):
        assert row is not None
        assert same_content(row, INTENT)
        assert not same_content(row, other)


def test_dicts_built_in_another_order_are_the_same_content() -> None:
    """Given the same arguments built in reverse order, then both digests are unchanged."""
    context = INTENT.command.context  # type: ignore[union-attr]
    reordered_context = msgspec.structs.replace(context, arguments=dict(reversed(list(context.arguments.items()))))
    reordered = msgspec.structs.replace(
        INTENT, command=msgspec.structs.replace(INTENT.command, context=reordered_context)
    )

    assert submission_digest(reordered) == submission_digest(INTENT)
    assert positional_digest(reordered) == positional_digest(INTENT)


def test_a_declared_struct_field_holding_anything_else_has_no_positional_form() -> None:
    """Given a field declared as a Struct class holding a list of that class's values instead (a Python
    caller can build one), then no positional digest: read by position, it could pass for the Struct."""
    blob = msgspec.structs.astuple(OPEN.command.task_ref)  # type: ignore[union-attr]
    lookalike = msgspec.structs.replace(OPEN, command=msgspec.structs.replace(OPEN.command, task_ref=[None, *blob]))

    assert positional_digest(lookalike) is None
    assert submission_digest(lookalike) != submission_digest(OPEN)
