"""Screening: given any command, when screened, then its bounds and credentials are judged on its builtins.

``decide`` screens every command first; these tests screen values directly, including Struct classes
outside the command union, to show that nothing a key, a tag or a nested Struct says is lost.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from baton.domain import errors
from baton.domain.commands import RecordIntent
from baton.domain.events import BlobRef, IntentContext
from baton.domain.screening import screen

ALNUM = "A7b9C2d4E6f8G1h3J5k7L9m2N4p6Q8r1S3t5"


def _intent(authorization: str = "", arguments: dict[str, Any] | None = None) -> RecordIntent:
    context = IntentContext(turn=1, operation="op", authorization=authorization, arguments=arguments or {})
    return RecordIntent("op-1", "effect", "tool@1", context, "idem-1")


def test_a_grant_id_under_authorization_passes() -> None:
    """An authorization binding (a grant id, not a header) is no credential."""
    screen(_intent("auth-1"))


@pytest.mark.parametrize("header", ["Bearer " + ALNUM, "Basic dXNlcjpwYXNz"])
def test_a_header_under_authorization_is_a_credential(header: str) -> None:
    """A header-shaped authorization in the intent context is rejected, naming where it was found."""
    with pytest.raises(errors.CredentialInPayload, match=r"\$\.context\.authorization"):
        screen(_intent(header))


class _Vault(msgspec.Struct):
    api_key: str | None = None
    note: str = ""


class _Renamed(msgspec.Struct, rename={"note": "ghp_" + ALNUM}):
    note: str = ""


class _Tagged(msgspec.Struct, tag="ghp_" + ALNUM):
    note: str = ""


class _Sized(msgspec.Struct, tag=True):
    ref: BlobRef | None = None
    refs: list[BlobRef] = []


@pytest.mark.parametrize(
    ("value", "rejection"),
    [
        (_Vault(api_key="abc"), errors.CredentialInPayload),  # a credential-named field of a Struct
        (_Vault(note="ghp_" + ALNUM), errors.CredentialInPayload),  # a format in a field's value
        (_Renamed(), errors.CredentialInPayload),  # a format in a field's own key
        (_Tagged(), errors.CredentialInPayload),  # a format in a tag
        (_Sized(ref=BlobRef("sha256:x", -1)), errors.Malformed),  # a negative size in a nested Struct
        (_Sized(refs=[BlobRef("sha256:x", -1)]), errors.Malformed),  # ... and in a Struct inside a list
        ({"password": "hunter2"}, errors.CredentialInPayload),  # not a Struct at all
    ],
)
def test_what_keys_tags_and_nested_structs_say_is_screened(value: Any, rejection: type[errors.Rejection]) -> None:
    """Keys, tags and nested Structs are screened as the builtins spell them."""
    with pytest.raises(rejection):
        screen(value)


def test_clean_values_of_those_classes_pass() -> None:
    """The same classes with nothing to find pass, so the rejections above are about their content."""
    for value in (_Vault(api_key=None, note="fine"), _Vault(api_key=""), _Sized(ref=BlobRef("sha256:x", 0))):
        screen(value)


def test_bounds_are_judged_before_credentials() -> None:
    """Given a command with both an over-long id and a credential, when screened, then the bound is named."""
    command = RecordIntent("o" * 201, "pure", "tool@1", IntentContext(1, "op", arguments={"token": "abc"}), "k")

    with pytest.raises(errors.Malformed, match="op_id is 201 characters"):
        screen(command)
