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
  password. Keys of the ``sk-`` family and bearer tokens must also look random (a run of 16 letters
  and digits with both kinds), so slugs and prose do not match; hex digests never match anything.

The walk is iterative and bounded. A value it cannot screen completely (nested deeper than
``MAX_DEPTH`` or with more than ``MAX_NODES`` nodes) is reported too: screening fails closed.
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
_SEPARATORS = str.maketrans("", "", "-_. ")  # dropped from a key before it is compared
_HEADER_SHAPED = re.compile(r"^\s*[A-Za-z][A-Za-z0-9.+-]*\s+\S{4,}")

_FORMATS = re.compile(
    r"(?P<pem>-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----)"
    r"|(?P<aws>\b(?:AKIA|ASIA)[0-9A-Z]{16}\b)"
    r"|(?P<github>\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,}))"
    r"|(?P<slack>\bxox[baprs]-[A-Za-z0-9-]{10,})"
    r"|(?P<sk>\bsk-[A-Za-z0-9_-]{20,})"
    r"|(?P<google>\bAIza[0-9A-Za-z_-]{35})"
    r"|(?P<bearer>\b[Bb]earer\s+[A-Za-z0-9._~+/-]{16,}=*)"
    r"|(?P<jwt>\beyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*)"
    r"|(?P<url>\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@)"
)
_DESCRIPTIONS = {
    "pem": "a PEM private key block",
    "aws": "an AWS access key id",
    "github": "a GitHub token",
    "slack": "a Slack token",
    "sk": "an OpenAI/Anthropic-style secret key",
    "google": "a Google API key",
    "bearer": "a bearer token",
    "jwt": "a JSON Web Token",
    "url": "a URL with an embedded password",
}
_RANDOM_RUN = re.compile(r"[A-Za-z0-9]{16,}")
_NEEDS_RANDOMNESS = frozenset({"sk", "bearer"})
_MAX_PATH_SEGMENT = 40


def find_credential(value: Any) -> str | None:
    """A short description of the first credential found in ``value`` (never the secret), or None."""
    stack: list[tuple[str, Any, int]] = [("$", value, 0)]
    nodes = 0
    while stack:
        path, item, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            return f"a value with more than {MAX_NODES} nodes, which cannot be screened completely"
        if isinstance(item, str):
            found = _format_in(item)
            if found:
                return f"{found} at {path}"
        elif isinstance(item, dict | list | tuple):
            if depth >= MAX_DEPTH:
                return f"nesting deeper than {MAX_DEPTH} levels at {path}, which cannot be screened completely"
            children = _children(path, item, depth)
            if isinstance(children, str):
                return children
            stack.extend(reversed(children))  # reversed: report the first credential in document order
    return None


def _children(
    path: str, item: dict[Any, Any] | list[Any] | tuple[Any, ...], depth: int
) -> list[tuple[str, Any, int]] | str:
    """The items of a container to visit next, or the description of a credential among its keys."""
    if not isinstance(item, dict):
        return [(f"{path}[{index}]", child, depth + 1) for index, child in enumerate(item)]
    children = []
    for key, child in item.items():
        name = str(key)
        found = _format_in(name)
        if found:
            return f"{found} in an object key under {path}"
        child_path = f"{path}.{name[:_MAX_PATH_SEGMENT]}"
        if is_credential_key(name, child):
            return f"a credential-named key at {child_path}"
        children.append((child_path, child, depth + 1))
    return children


def is_credential_key(name: str, value: Any) -> bool:
    """Whether the walk reports the object member ``name: value`` (value as builtins) for its key's name."""
    if value is None or isinstance(value, bool) or (isinstance(value, str | dict | list | tuple) and not value):
        return False
    normalized = name.lower().translate(_SEPARATORS)
    if normalized.endswith(_AUTHORIZATION):
        return isinstance(value, str) and _HEADER_SHAPED.match(value) is not None
    return normalized.endswith(NAMES)


def _format_in(text: str) -> str | None:
    for match in _FORMATS.finditer(text):
        kind = match.lastgroup or ""
        if kind not in _NEEDS_RANDOMNESS or _looks_random(match.group()):
            return _DESCRIPTIONS[kind]
    return None


def _looks_random(candidate: str) -> bool:
    """A run of 16+ letters and digits holding both: random keys have one, slugs and prose do not."""
    return any(
        any(c.isdigit() for c in run) and any(c.isalpha() for c in run) for run in _RANDOM_RUN.findall(candidate)
    )
