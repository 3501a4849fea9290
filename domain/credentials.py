"""Credential screening: authority travels by reference, so credential material is never stored.

``find_credential`` walks any JSON-like value (dicts, lists, tuples, strings, numbers) and reports
the first credential it recognises, as a short description that never contains the secret:

- **key names**, compared after lower-casing and dropping ``-``, ``_``, ``.`` and spaces, when the
  key *ends with* one of ``NAMES`` (so ``GITHUB_TOKEN``, ``X-Api-Key`` and ``aws_secret_access_key``
  match while ``max_tokens``, ``secret_ref`` and ``tokenizer`` do not) and its value carries
  something (not ``None``, a bool, ``""`` or an empty container). ``authorization`` is special: the
  domain uses it for authorization *bindings* (ids such as ``"auth-1"``), so only a value shaped like
  an HTTP header, ``<scheme> <credentials>``, counts;
- **formats**, anywhere in a string (keys included): PEM private key blocks, AWS access key ids,
  GitHub, Slack, OpenAI/Anthropic-style and Google API keys, ``Bearer`` tokens, JWTs and URLs with a
  password (``scheme://user:password@``). Keys of the ``sk-`` family and bearer tokens must also
  look random (a run of 16 letters and digits with both kinds), so slugs and prose do not match;
  hex digests never match anything.

The walk is recursive and bounded. A value it cannot screen completely (nested deeper than
``MAX_DEPTH``, far below Python's recursion limit, or with more than ``MAX_NODES`` nodes) is
reported too: screening fails closed. Paths are built only for what is found.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MAX_DEPTH", "MAX_NODES", "NAMES", "find_credential", "is_credential_key"]

MAX_DEPTH = 64
MAX_NODES = 1_000_000  # every node of a 1 MiB JSON document takes at least 2 bytes

NAMES = (
    "password",
    "passwd",
    "passphrase",
    "secret",
    "secrets",
    "token",
    "apikey",
    "privatekey",
    "accesskey",
    "clientsecret",
    "credential",
    "credentials",
)
_AUTHORIZATION = "authorization"
_SEPARATORS = ("-", "_", ".", " ")  # dropped from a key before it is compared
_HEADER_SHAPED = re.compile(r"^\s*[A-Za-z][A-Za-z0-9.+-]*\s+\S{4,}")

# Each format's pattern starts with a literal character; a lookbehind just after its first literal
# says what must precede it (``\b``: the format starts a word). ``True``: a match must also look random.
_FORMATS = (
    ("a PEM private key block", r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----", False),
    ("an AWS access key id", r"A[KS]IA(?<=\bA[KS]IA)[0-9A-Z]{16}\b", False),
    ("a GitHub token", r"g(?<=\bg)(?:h[pousr]_[A-Za-z0-9]{36,}|ithub_pat_[A-Za-z0-9_]{22,})", False),
    ("a Slack token", r"xox(?<=\bxox)[baprs]-[A-Za-z0-9-]{10,}", False),
    ("an OpenAI/Anthropic-style secret key", r"sk-(?<=\bsk-)[A-Za-z0-9_-]{20,}", True),
    ("a Google API key", r"AIza(?<=\bAIza)[0-9A-Za-z_-]{35}", False),
    ("a bearer token", r"earer(?<=\b[Bb]earer)\s+[A-Za-z0-9._~+/-]{16,}=*", True),
    ("a JSON Web Token", r"eyJ(?<=\beyJ)[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*", False),
    ("a URL with an embedded password", r"://(?<=[A-Za-z0-9+.-]://)[^/\s:@]+:[^/\s@]+@", False),
)
if any(not (pattern[0].isalnum() or pattern[0] in "-:") for _, pattern, _ in _FORMATS):
    raise RuntimeError("every format must start with a literal character")
# One search for all formats. Every branch starts with its literal, outside the branch's group, so
# the engine tries only positions holding one of those characters (a branch starting with a group
# would make it try all nine at every position); the group's number names the format.
_ANY_FORMAT = re.compile("|".join(f"{pattern[0]}({pattern[1:]})" for _, pattern, _ in _FORMATS))
_RANDOM_RUN = re.compile(r"[A-Za-z0-9]{16,}")
_MAX_PATH_SEGMENT = 40


def find_credential(value: Any) -> str | None:
    """A short description of the first credential found in ``value`` (never the secret), or None."""
    walk = _Walk()
    found = walk.visit(value, 0)
    if found is None:
        return None
    return found.describe()


class _Found:
    """What the walk found, and the path to it, gathered segment by segment on the way back up."""

    def __init__(self, template: str, segment: str = "") -> None:
        self.template = template  # "{path}" stands for where it was found
        self.segments = [segment] if segment else []

    def describe(self) -> str:
        return self.template.replace("{path}", "$" + "".join(reversed(self.segments)))


class _Walk:
    """A depth-first walk in document order that counts the nodes it visits (screening fails closed)."""

    def __init__(self) -> None:
        self.nodes = 0

    def visit(self, item: Any, depth: int) -> _Found | None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            return _Found(f"a value with more than {MAX_NODES} nodes, which cannot be screened completely")
        if isinstance(item, str):
            found = _format_in(item)
            return None if found is None else _Found(found + " at {path}")
        if isinstance(item, dict | list | tuple):
            if depth >= MAX_DEPTH:
                return _Found(
                    f"nesting deeper than {MAX_DEPTH} levels at {{path}}, which cannot be screened completely"
                )
            return self._members(item, depth) if isinstance(item, dict) else self._items(item, depth)
        return None

    def _items(self, item: list[Any] | tuple[Any, ...], depth: int) -> _Found | None:
        for index, child in enumerate(item):
            hit = self.visit(child, depth + 1)
            if hit is not None:
                hit.segments.append(f"[{index}]")
                return hit
        return None

    def _members(self, item: dict[Any, Any], depth: int) -> _Found | None:
        """An object's keys first (a secret as a key, a credential-named key), then its values."""
        for key, child in item.items():
            name = str(key)
            found = _format_in(name)
            if found:
                return _Found(found + " in an object key under {path}")
            if is_credential_key(name, child):
                return _Found("a credential-named key at {path}", f".{name[:_MAX_PATH_SEGMENT]}")
        for key, child in item.items():
            hit = self.visit(child, depth + 1)
            if hit is not None:
                hit.segments.append(f".{str(key)[:_MAX_PATH_SEGMENT]}")
                return hit
        return None


def is_credential_key(name: str, value: Any) -> bool:
    """Whether the walk reports the object member ``name: value`` (value as builtins) for its key's name."""
    if value is None or isinstance(value, bool) or (isinstance(value, str | dict | list | tuple) and not value):
        return False
    normalized = name.lower()
    for separator in _SEPARATORS:
        normalized = normalized.replace(separator, "")
    if normalized.endswith(_AUTHORIZATION):
        return isinstance(value, str) and _HEADER_SHAPED.match(value) is not None
    return normalized.endswith(NAMES)


def _format_in(text: str) -> str | None:
    match = _ANY_FORMAT.search(text)
    while match is not None:
        description, _, must_look_random = _FORMATS[(match.lastindex or 1) - 1]
        if not must_look_random or _looks_random(match.group()):
            return description
        match = _ANY_FORMAT.search(text, match.end())
    return None


def _looks_random(candidate: str) -> bool:
    """A run of 16+ letters and digits holding both: random keys have one, slugs and prose do not."""
    return any(
        any(c.isdigit() for c in run) and any(c.isalpha() for c in run) for run in _RANDOM_RUN.findall(candidate)
    )
