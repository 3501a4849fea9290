"""The bounds prefilter: when the command's JSON text says "within bounds", the exact walk agrees."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from baton.domain import errors
from baton.domain.credentials import MAX_DEPTH, within_prefilter_bounds
from baton.domain.decide import (
    MAX_ID_LENGTH,
    _check_bounds,
    _each_surely_bounded,
    _lists_surely_short,
    _strings_surely_within_bounds,
)

LONG = st.integers(190, 210).map(lambda n: "x" * n)
TEXT = st.one_of(st.text(max_size=8), LONG, st.just('q"uote\\'), st.just("é" * 150))
KEYS = st.sampled_from(["op_id", "note", "size", "arguments", "result", "document", "items"])
VALUES = st.recursive(
    st.one_of(TEXT, st.integers(-3, 3), st.none(), st.booleans()),
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.integers(250, 262).map(lambda n: [0] * n),
        st.dictionaries(KEYS, children, max_size=4),
    ),
    max_leaves=8,
)


@settings(max_examples=1500, deadline=None)
@given(st.dictionaries(KEYS, VALUES, max_size=5))
def test_the_bounds_prefilter_never_passes_what_the_walk_refuses(plain: dict[str, Any]) -> None:
    """Text the prefilter calls within bounds, by its search or by its length alone, is never refused
    by ``_check_bounds``."""
    text = msgspec.json.encode(plain)
    within = _strings_surely_within_bounds(text) or _strings_surely_within_bounds(text, longest=len(text))
    if _lists_surely_short(text) and within:
        try:
            _check_bounds(plain, "command")
        except errors.Malformed as exc:  # pragma: no cover - the failure this test exists to catch
            raise AssertionError(f"prefilter passed a value the walk refuses: {exc}") from None


def test_a_string_one_past_the_limit_is_never_skipped_for_its_length() -> None:
    """Given the shortest JSON text holding a string one character past the limit, when the
    prefilter is told it is the longest text, then it still searches and finds the string; a text
    one character shorter is within bounds."""
    past = msgspec.json.encode("x" * (MAX_ID_LENGTH + 1))
    at = msgspec.json.encode("x" * MAX_ID_LENGTH)

    assert not _strings_surely_within_bounds(past, longest=len(past))
    assert _strings_surely_within_bounds(at, longest=len(at))


def test_short_texts_are_cleared_by_their_length_where_the_search_would_flag_the_join() -> None:
    """Given two short texts whose quote-free bytes run on across the newline that joins them (the
    search reads that run as one long string), when the prefilter is told their longest length,
    then it clears them without searching, and the walk agrees with each."""
    first = msgspec.json.encode(["a", *[1] * 98])
    second = msgspec.json.encode([2] * 51)
    joined = first + b"\n" + second
    longest = max(len(first), len(second))

    assert longest <= MAX_ID_LENGTH + 1
    assert not _strings_surely_within_bounds(joined)
    assert _strings_surely_within_bounds(joined, longest=longest)
    for text in (first, second):
        _check_bounds(msgspec.json.decode(text), "command")


@settings(max_examples=400, deadline=None)
@given(st.lists(st.dictionaries(KEYS, VALUES, max_size=5), min_size=1, max_size=6))
def test_the_batch_count_agrees_with_each_text_counted_alone(batch: list[dict[str, Any]]) -> None:
    """Given JSON texts joined by newlines, when the commas and the brackets are counted per text in
    one pass over the join, then the verdict is that of counting each text on its own."""
    texts = [msgspec.json.encode(plain) for plain in batch]
    alone = all(_lists_surely_short(text) and within_prefilter_bounds(text) for text in texts)

    assert _each_surely_bounded(b"\n".join(texts), max(map(len, texts))) == alone


def test_a_text_nested_to_the_limit_fails_the_batch_count_as_it_fails_alone() -> None:
    """Given one text nested to the depth limit among shallow ones, when counted together, then the batch
    is not cleared; with one level less, it is (so the count is per text, not over the join)."""
    shallow = [msgspec.json.encode({"a": [1, 2]}) for _ in range(40)]
    deep, shallower = (msgspec.json.encode(_nested(depth)) for depth in (MAX_DEPTH, MAX_DEPTH - 1))

    assert not _each_surely_bounded(b"\n".join([*shallow, deep]), len(deep))
    assert _each_surely_bounded(b"\n".join([*shallow, shallower]), len(shallower))


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value
