"""Screening fast paths: given any command, when screened, then the same outcome as the reference walk.

The reference is what ``_screen`` falls back to: the command's builtins, ``_check_bounds``, then the
exact credential walk (``credentials._walk``, without its own prefilter). Commands of every class of
the union are generated from their schemas, with strings that carry credential formats, credential
names, long and escaped texts, negative sizes and long lists, so each prefilter is pushed over its
edge both ways.
"""

from __future__ import annotations

import datetime
import typing
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from baton.domain import credentials, errors
from baton.domain.budgets import Usage
from baton.domain.commands import Command, OpenRun, RecordIntent, RecordObservation
from baton.domain.decide import _check_bounds, _keyless, _screen, positional_text, screened_texts
from baton.domain.events import BlobRef, IntentContext

ALNUM = "A7b9C2d4E6f8G1h3J5k7L9m2N4p6Q8r1S3t5"
SECRETS = [
    "ghp_" + ALNUM,
    "Bearer " + ALNUM,
    "sk-" + ALNUM,
    "AKIA" + "Z7Q2X9W4V6U3T8S5",
    "postgresql://u:" + "pw@db/x",
    "eyJhbGciOiJIUzI1NiJ9" + ".eyJzdWIiOiIxIn0" + ".c2ln",
    "-----BEGIN " + "PRIVATE KEY-----",
    "Basic dXNlcjpwYXNz",
]
TEXT = st.one_of(
    st.text(max_size=10),
    st.sampled_from(SECRETS),
    st.sampled_from(["Basic dXNlcjpwYXNz", "Digest username=x", "Token abcd1234"]),  # header-shaped only
    st.sampled_from(["", "auth-1", "sk-", "eyJ", "a:b@", 'q"uote\\', "é" * 150, "to\u212aen", "x" * 201]),
    st.integers(195, 205).map(lambda n: "y" * n),
)
KEYS = st.one_of(
    st.sampled_from([*credentials.NAMES, "Authorization", "api-key", "size", "arguments", "note", "document"]),
    TEXT,
)
JSON = st.recursive(
    st.one_of(TEXT, st.integers(-3, 3), st.none(), st.booleans(), st.just([]), st.just({})),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.integers(254, 258).map(lambda n: list(range(n))),
        st.dictionaries(KEYS, children, max_size=3),
    ),
    max_leaves=8,
)


def _strategy(kind: msgspec.inspect.Type) -> st.SearchStrategy[Any]:  # noqa: PLR0911 - one case per schema type
    """Values of a schema type, biased to the edges screening cares about."""
    if isinstance(kind, msgspec.inspect.StrType):
        return TEXT
    if isinstance(kind, msgspec.inspect.IntType):
        return st.integers(-2, 2)
    if isinstance(kind, msgspec.inspect.BoolType):
        return st.booleans()
    if isinstance(kind, msgspec.inspect.NoneType):
        return st.none()
    if isinstance(kind, msgspec.inspect.LiteralType):
        return st.sampled_from(kind.values)
    if isinstance(kind, msgspec.inspect.EnumType):
        return st.sampled_from(list(kind.cls))
    if isinstance(kind, msgspec.inspect.UnionType):
        return st.one_of(*[_strategy(member) for member in kind.types])
    if isinstance(kind, msgspec.inspect.VarTupleType):
        item = _strategy(kind.item_type)
        return st.one_of(st.lists(item, max_size=3), st.integers(255, 258).map(lambda n: ["t"] * n)).map(tuple)
    if isinstance(kind, msgspec.inspect.StructType):
        fields = {field.name: _strategy(field.type) for field in kind.fields}
        return st.fixed_dictionaries(fields).map(lambda values: kind.cls(**values))
    return JSON  # Any, and dict[str, Any]: opaque payloads


COMMANDS = st.one_of(
    *[_strategy(msgspec.inspect.type_info(cls)) for cls in typing.get_args(Command)],
    _strategy(msgspec.inspect.type_info(RecordIntent)),  # twice: the one with a credential-named field
)


def _reference(command: Any) -> None:
    plain = msgspec.to_builtins(command)
    _check_bounds(plain, "command")
    found = credentials._walk(plain)
    if found:
        raise errors.CredentialInPayload(f"the submission carries {found}: pass authority by reference")


def _outcome(screen: Any, command: Any) -> tuple[str, str]:
    try:
        screen(command)
    except errors.Rejection as exc:
        return type(exc).__name__, str(exc)
    return "passed", ""


@settings(max_examples=3000, deadline=None)
@given(COMMANDS)
def test_screening_decides_as_the_reference_walk_does(command: Any) -> None:
    """Whatever the command, the prefiltered screen rejects exactly what the reference rejects, alike."""
    assert _outcome(_screen, command) == _outcome(_reference, command)


def _intent(authorization: str = "", arguments: dict[str, Any] | None = None) -> RecordIntent:
    context = IntentContext(turn=1, operation="op", authorization=authorization, arguments=arguments or {})
    return RecordIntent("op-1", "effect", "tool@1", context, "idem-1")


def test_a_grant_id_under_authorization_passes_without_the_walk() -> None:
    """An authorization binding (a grant id, not a header) is no credential, and needs no walk to say so."""
    _keyless(_intent("auth-1"))  # would raise _Unsure: the value under a credential name is settled here

    _screen(_intent("auth-1"))


@pytest.mark.parametrize("header", ["Bearer " + ALNUM, "Basic dXNlcjpwYXNz"])
def test_a_header_under_authorization_is_a_credential(header: str) -> None:
    """A header-shaped authorization in the intent context is rejected, naming where it was found."""
    with pytest.raises(errors.CredentialInPayload, match=r"\$\.context\.authorization"):
        _screen(_intent(header))


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
        (_Renamed(), errors.CredentialInPayload),  # a format in a field's own key: the class is never planned
        (_Tagged(), errors.CredentialInPayload),  # a format in a tag: the keyless text keeps tags
        (_Sized(ref=BlobRef("sha256:x", -1)), errors.Malformed),  # a negative size in a nested Struct
        (_Sized(refs=[BlobRef("sha256:x", -1)]), errors.Malformed),  # ... and in a Struct inside a list
        ({"password": "hunter2"}, errors.CredentialInPayload),  # not a Struct at all: the reference decides
    ],
)
def test_keys_the_keyless_text_drops_are_still_screened(value: Any, rejection: type[errors.Rejection]) -> None:
    """Keys missing from the keyless text are judged per class or per value: nothing they say is lost."""
    with pytest.raises(rejection):
        _screen(value)
    assert _outcome(_screen, value) == _outcome(_reference, value)


def test_clean_values_of_those_classes_pass() -> None:
    """The same classes with nothing to find pass, so the rejections above are about their content."""
    for value in (_Vault(api_key=None, note="fine"), _Vault(api_key=""), _Sized(ref=BlobRef("sha256:x", 0))):
        _screen(value)


@settings(max_examples=1500, deadline=None)
@given(st.lists(COMMANDS, min_size=2, max_size=6))
def test_a_batch_cleared_together_holds_only_commands_the_reference_passes(commands: list[Any]) -> None:
    """Whatever the batch, clearing it in one pass never lets through a command the reference rejects."""
    if screened_texts(commands) is not None:
        assert [_outcome(_reference, command) for command in commands] == [("passed", "")] * len(commands)


def _clean(i: int) -> RecordIntent:
    context = IntentContext(turn=i, operation="search", arguments={"query": "weather in paris", "limit": 10})
    return RecordIntent(f"op-{i}", "pure", "tools.search@1", context, f"run/op-{i}")


def test_a_batch_of_ordinary_intents_is_cleared_in_one_pass() -> None:
    """Typical intents are cleared together, so a batch does not screen each of them again."""
    assert screened_texts([_clean(i) for i in range(50)]) is not None


SUSPECTS = [
    *(_intent(arguments={"note": text}) for text in [*SECRETS[:-1], "y" * 201, 'q"uote\\']),
    _intent(arguments={"api_key": "abc"}),
    _intent(authorization=SECRETS[-1]),  # a header is a credential only under authorization
]


@pytest.mark.parametrize("suspect", SUSPECTS)
def test_one_suspect_command_sends_the_whole_batch_to_be_screened_alone(suspect: RecordIntent) -> None:
    """One credential, long string or escape anywhere in a batch: the batch is not cleared together."""
    batch = [_clean(i) for i in range(50)]
    batch[37] = suspect

    assert screened_texts(batch) is None


class _RaisingZone(datetime.tzinfo):
    def utcoffset(self, dt: datetime.datetime | None) -> datetime.timedelta:
        raise LookupError("no such zone")

    def dst(self, dt: datetime.datetime | None) -> None:
        return None


def test_a_command_that_cannot_be_encoded_is_left_to_its_own_screen() -> None:
    """Given a batch holding a value whose encoding raises (whatever it raises), when screened together,
    then the batch is not cleared and nothing is raised: each command meets its own screen."""
    odd = _intent(arguments={"at": datetime.datetime(2026, 1, 1, tzinfo=_RaisingZone())})

    assert screened_texts([_clean(1), odd]) is None


# -- the positional text: what screening reads is what the ledger digests as a submission's content


def _reordered(value: Any) -> Any:
    """The same content with every dict built in reverse key order (Structs rebuilt likewise)."""
    if isinstance(value, dict):
        return {key: _reordered(value[key]) for key in reversed(list(value))}
    if isinstance(value, list | tuple):
        return type(value)(_reordered(item) for item in value)
    if isinstance(value, msgspec.Struct):
        return msgspec.structs.replace(
            value, **{name: _reordered(getattr(value, name)) for name in value.__struct_fields__}
        )
    return value


def _content(command: Any) -> bytes:
    """Content as the first form of the submission digest compared it: sorted JSON."""
    return msgspec.json.encode(command, order="sorted")


@settings(max_examples=600, deadline=None)
@given(COMMANDS, COMMANDS, st.booleans())
def test_two_commands_share_a_positional_text_exactly_when_they_share_their_content(
    first: Any, other: Any, same: bool
) -> None:
    """Given two commands (half the time one content with its dicts built in another order), when
    written positionally, then the texts are equal exactly when the sorted JSON texts are."""
    second = _reordered(first) if same else other
    texts = positional_text(first), positional_text(second)
    if None in texts:
        return  # the ledger digests these in the first form
    assert (texts[0] == texts[1]) == (_content(first) == _content(second))


def test_a_declared_struct_field_holding_anything_else_has_no_positional_text() -> None:
    """Given a field declared as a Struct class holding a list of that class's values instead (a
    Python caller can build one), when written positionally, then there is no text (the content
    digest falls back to sorted JSON, which tells them apart): it cannot pass for the Struct."""
    blob = BlobRef("sha256:ab", 5, "blob://x")
    typed = OpenRun("rel-1", "schema", 1, blob)
    lookalike = msgspec.structs.replace(typed, task_ref=[None, *msgspec.structs.astuple(blob)])

    assert positional_text(typed) is not None
    assert positional_text(lookalike) is None
    assert screened_texts([typed, lookalike]) is None


def test_a_struct_in_an_opaque_payload_reads_as_the_equal_dict() -> None:
    """Given an observation whose result is a Struct, and one whose result is that Struct's builtins,
    when written positionally, then the texts are equal, as their sorted JSON is."""
    as_struct = RecordObservation("op-1", "sha256:c", "ok", result=Usage(calls=1, fuel=7))
    as_dict = msgspec.structs.replace(as_struct, result=msgspec.to_builtins(Usage(calls=1, fuel=7)))

    assert _content(as_struct) == _content(as_dict)
    assert positional_text(as_struct) == positional_text(as_dict) is not None


def test_a_cleared_batch_gives_each_command_its_positional_text() -> None:
    """Given a batch cleared in one pass, then its texts are each command's positional text, in order."""
    batch = [_clean(i) for i in range(5)]

    assert screened_texts(batch) == [positional_text(command) for command in batch]
