"""A submission's content digest: what tells a retry (same content) from a reused id (other content).

Each accepted submission's row holds the digest of its content. The digest is SHA-256 of
``baton.submission.v1\\x00`` and the submission's JSON with sorted keys: JSON keeps every type
distinct (``1`` is not ``"1"``), and sorted keys make dicts built in any order the same content.
The signature is left out, and so are fields added to a command later while at their default
(``domain.commands.ADDED_FIELDS``).

Some earlier releases wrote most rows in a second form (``baton.submission.v2``): the ids and epoch
as a JSON array, then the command's *positional* JSON (``positional_form``). A retry is compared
with both forms, so a submission such a release accepted is still answered ``duplicate``.
"""

from __future__ import annotations

import types
import typing
from typing import Any

import msgspec

from baton.domain.canonical import digest_of
from baton.domain.commands import ADDED_FIELDS, Command, Submission

__all__ = ["positional_digest", "positional_form", "same_content", "submission_digest"]

_PREFIX = b"baton.submission.v1\x00"
_POSITIONAL_PREFIX = b"baton.submission.v2\x00"
_sorted = msgspec.json.Encoder(order="sorted")
_COMMANDS = {cls.__struct_config__.tag: cls for cls in typing.get_args(Command)}
_DEFAULTS = {  # the builtins of each added field's default, by (command tag, field)
    (tag, field.name): msgspec.to_builtins(field.default)
    for tag, names in ADDED_FIELDS.items()
    for field in msgspec.structs.fields(_COMMANDS[tag])
    if field.name in names
}


def submission_digest(submission: Submission) -> str:
    """The content digest of ``submission``, as its row records it.

    The signature is not content (it vouches for it), and an unsigned submission has no
    ``signed_by`` either: such a submission digests as it did before submissions were signed.
    """
    plain = msgspec.to_builtins(submission)
    del plain["signature"]
    if not plain["signed_by"]:
        del plain["signed_by"]
    command = plain["command"]
    for name in ADDED_FIELDS.get(command["type"], ()):
        if command[name] == _DEFAULTS[command["type"], name]:
            del command[name]
    return digest_of(_PREFIX, _sorted.encode(plain))


def same_content(content_digest: str, submission: Submission) -> bool:
    """Whether a stored row's digest is that of ``submission``'s content, in either form."""
    return content_digest in {submission_digest(submission), positional_digest(submission)}


def positional_digest(submission: Submission) -> str | None:
    """The second form of the content digest, or None for a command the earlier releases digested
    in the first form (one whose positional form does not exist)."""
    form = positional_form(submission.command)
    if form is None:
        return None
    try:
        text = _sorted.encode(form)
    except (TypeError, ValueError, OverflowError):  # not encodable: those releases used the first form
        return None
    ids = msgspec.json.encode((submission.submission_id, submission.run_id, submission.worker, submission.epoch))
    return digest_of(_POSITIONAL_PREFIX, ids + text)


def positional_form(value: Any) -> list[Any] | None:
    """A Struct without its keys: its tag, then its fields' values in declaration order, a field
    declared as one Struct class (or that class or None) in this form too; other values as they are.

    None when such a field holds anything but that class or None: read by position, it could pass
    for a value of the class, so the earlier releases digested those commands in the first form.
    """
    tag = value.__struct_config__.tag
    form: list[Any] = [tag]
    for field in msgspec.structs.fields(value):
        item = getattr(value, field.name)
        if field.name in ADDED_FIELDS.get(tag, ()) and item == field.default:
            continue  # those releases had no such field
        declared = _declared_struct(field.type)
        if declared is not None and item is not None:
            if type(item) is not declared:
                return None
            item = positional_form(item)
            if item is None:
                return None
        form.append(item)
    return form


def _declared_struct(annotation: Any) -> type | None:
    """The Struct class a field is declared as (``BlobRef``, ``BlobRef | None``), else None."""
    union = isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union
    members = typing.get_args(annotation) if union else (annotation,)
    classes = [member for member in members if member is not type(None)]
    if len(classes) == 1 and isinstance(classes[0], type) and issubclass(classes[0], msgspec.Struct):
        return classes[0]
    return None
