"""What every submission is screened for before any rule looks at it: bounded ids, strings and
lists, no negative blob size, and no credential material (authority travels by reference).

Screening reads the submission's builtins, so it judges exactly what would be stored. It runs in
``decide``, once per submission; the transports only decode.
"""

from __future__ import annotations

from typing import Any

import msgspec

from baton.domain import errors
from baton.domain.canonical import OPAQUE_KEYS
from baton.domain.commands import Submission
from baton.domain.credentials import find_credential

__all__ = ["MAX_ID_LENGTH", "MAX_LIST_ITEMS", "MAX_TEXT_LENGTH", "check_ids", "screen"]

MAX_ID_LENGTH = 200
MAX_TEXT_LENGTH = 4096
MAX_LIST_ITEMS = 256
_ID_FIELDS = frozenset(
    {"op_id", "stage_id", "checkpoint_id", "idempotency_key", "tool_contract", "worker", "release_id"}
)


def check_ids(submission: Submission) -> None:
    """The ids become keys and columns: bounded, and free of NUL (which no SQL text column can hold)."""
    ids = {"submission_id": submission.submission_id, "run_id": submission.run_id, "worker": submission.worker}
    for name, value in ids.items():
        if not value or len(value) > MAX_ID_LENGTH or "\x00" in value:
            msg = f"{name} must be 1..{MAX_ID_LENGTH} characters, none of them NUL"
            raise errors.Malformed(msg)
    if submission.epoch < 0:
        raise errors.Malformed("epoch cannot be negative")


def screen(value: Any) -> None:
    """Bounds first, then credentials, over the builtins of ``value`` (``decide`` passes the whole
    submission: its ids are screened too); raises the first rejection."""
    plain = msgspec.to_builtins(value)
    _check_bounds(plain, "command")
    found = find_credential(plain)
    if found:
        raise errors.CredentialInPayload(f"the submission carries {found}: pass authority by reference")


def _check_bounds(value: Any, key: str) -> None:
    """Every string and list outside the opaque payloads is bounded, and no blob size is negative.

    Opaque payloads (arguments, results) are bounded as a whole by ``MAX_INLINE_BYTES`` instead.
    Errors name the field by its key.
    """
    kind = type(value)
    if kind is str:
        _check_text(value, key)
    elif kind is list or kind is tuple:  # ``to_builtins`` keeps a Struct's tuple fields as tuples
        if len(value) > MAX_LIST_ITEMS:
            raise errors.Malformed(f"{key} has {len(value)} items; the limit is {MAX_LIST_ITEMS}")
        for item in value:
            _check_bounds(item, key)
    elif kind is dict:
        for name, item in value.items():
            if name in OPAQUE_KEYS or name == "document":  # a handoff document has its own bound
                continue
            if name == "size" and type(item) is int and item < 0:
                raise errors.Malformed(f"{key}.size cannot be negative")
            _check_bounds(item, name)


def _check_text(value: str, key: str) -> None:
    limit = MAX_ID_LENGTH if key in _ID_FIELDS else MAX_TEXT_LENGTH
    if len(value) > limit:
        raise errors.Malformed(f"{key} is {len(value)} characters; the limit is {limit}")
    if "\x00" in value and key in _ID_FIELDS:  # ids become keys and columns: a worker, the run row's holder
        raise errors.Malformed(f"{key} holds a NUL character")
