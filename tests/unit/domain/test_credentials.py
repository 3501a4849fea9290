"""Credential screening: given a JSON-like value, when screened, then the credential is named or None.

Every fake secret below is assembled from pieces at import time, so no literal in this file looks
like a live credential to a secret scanner, while the screened strings have the real shapes.
"""

from __future__ import annotations

from typing import Any

import pytest

from baton.domain import credentials
from baton.domain.credentials import MAX_DEPTH, find_credential

ALNUM = "A7b9C2d4E6f8G1h3J5k7L9m2N4p6Q8r1S3t5"  # 36 mixed letters and digits
PEM = "-----BEGIN " + "RSA PRIVATE KEY-----\nMIIEow...\n-----END RSA PRIVATE KEY-----"

POSITIVE_FORMATS = {
    "pem_rsa": (PEM, "PEM private key"),
    "pem_openssh": ("-----BEGIN " + "OPENSSH PRIVATE KEY-----", "PEM private key"),
    "pem_pkcs8": ("x -----BEGIN " + "PRIVATE KEY----- y", "PEM private key"),
    "pem_pgp": ("-----BEGIN " + "PGP PRIVATE KEY BLOCK-----", "PEM private key"),
    "aws_akia": ("AKIA" + "Z7Q2X9W4V6U3T8S5", "AWS access key id"),
    "aws_asia_in_text": ("export id=ASIA" + "Z7Q2X9W4V6U3T8S5 now", "AWS access key id"),
    "github_classic": ("ghp_" + ALNUM, "GitHub token"),
    "github_oauth": ("gho_" + ALNUM, "GitHub token"),
    "github_fine_grained": ("github_pat_" + "11AB" + ALNUM[:20] + "_" + ALNUM, "GitHub token"),
    "slack_bot": ("xoxb-" + "1234567890-" + ALNUM[:24], "Slack token"),
    "slack_user": ("xoxp-" + "1234567890-abcdef", "Slack token"),
    "openai": ("sk-" + ALNUM + "Zz09Yy87Xx65", "OpenAI/Anthropic-style secret key"),
    "openai_project": ("sk-proj-" + ALNUM + "-" + ALNUM, "OpenAI/Anthropic-style secret key"),
    "anthropic": ("sk-ant-api03-" + ALNUM + ALNUM + "-AA", "OpenAI/Anthropic-style secret key"),
    "google": ("AIza" + "Sy" + ALNUM[:33], "Google API key"),
    "bearer": ("Bearer " + ALNUM, "bearer token"),
    "bearer_lowercase_in_header_text": ("authorization: bearer " + ALNUM + "==", "bearer token"),
    "jwt": ("eyJhbGciOiJIUzI1NiJ9" + ".eyJzdWIiOiIxIn0" + ".c2lnbmF0dXJlLXNpZw", "JSON Web Token"),
    "unsigned_jwt": ("eyJhbGciOiJub25lIn0" + ".eyJzdWIiOiIxIn0.", "JSON Web Token"),
    "url_with_password": ("postgresql://baton:" + "hunter2@db.internal/ledger", "URL with an embedded password"),
}


@pytest.mark.parametrize(("text", "kind"), POSITIVE_FORMATS.values(), ids=POSITIVE_FORMATS.keys())
def test_well_known_secret_formats_are_found_without_echoing_them(text: str, kind: str) -> None:
    """A secret in a string value is reported by kind and path, never by its text."""
    found = find_credential({"notes": ["fine", {"blob": text}]})

    assert found is not None
    assert kind in found
    assert "$.notes[1].blob" in found
    assert text.strip() not in found


POSITIVE_KEYS = {
    "password": {"password": "hunter2"},
    "passwd_upper": {"PASSWD": "hunter2"},
    "secret": {"Secret": "x"},
    "token_nested": {"config": {"db": {"auth_token": "abc"}}},
    "api_key_snake": {"api_key": "abc"},
    "apikey_camel": {"apiKey": "abc"},
    "api_key_header": {"X-Api-Key": "abc"},
    "private_key": {"private_key": {"n": 1, "d": 2}},
    "access_key": {"aws_secret_access_key": "abc"},
    "client_secret": {"client.secret": "abc"},
    "github_token_env": {"env": {"GITHUB_TOKEN": "abc"}},
    "numeric_password": {"pin_password": 1234},
    "credentials_list": {"credentials": ["user", "pass"]},
    "authorization_header": {"headers": {"Authorization": "Basic dXNlcjpwYXNz"}},
    "proxy_authorization": {"Proxy-Authorization": "Digest username=x"},
}


@pytest.mark.parametrize("value", POSITIVE_KEYS.values(), ids=POSITIVE_KEYS.keys())
def test_credential_named_keys_with_a_value_are_found(value: dict[str, Any]) -> None:
    """A key named like a credential (any case, any separators) holding something is reported."""
    found = find_credential([value])

    assert found is not None
    assert "credential-named key" in found


NEGATIVES = {
    "plain_words": {"goal": "rotate the secret token password later", "note": "skip risk-assessment"},
    "sha256_digests": {"digest": "sha256:" + "ab12" * 16, "prev_digest": "sha256:" + "0" * 64},
    "hex_uppercase": "DEADBEEF" * 8,
    "token_counts": {"max_tokens": 4096, "prompt_tokens": 12, "tokens": 3, "tokenizer": "bpe"},
    "references_not_material": {"secret_ref": "vault://kv/openai", "api_key_id": "key-7", "password_hash": "x"},
    "empty_or_absent_values": {"password": "", "token": None, "secret": {}, "api_key": [], "is_secret": True},
    "authorization_binding": {"authorization": "auth-1", "authority_context_ref": "sha256:a"},
    "sk_slug": "sk-learn-is-a-library-name-with-many-words",
    "sk_short": "sk-1234",
    "bearer_in_prose": "the Bearer authenticationscheme is described in RFC 6750",
    "akia_lowercase": "akia" + "z7q2x9w4v6u3t8s5",
    "aws_like_too_short": "AKIA" + "Z7Q2X9",
    "eyj_alone": "eyJhbGciOiJIUzI1NiJ9",
    "url_without_password": "ssh://git@github.com/org/repo.git https://example.com/a:b",
    "numbers_and_bools": [1, -2, 2**70, True, False, None],
    "pem_public_key": "-----BEGIN " + "PUBLIC KEY-----",
    "pem_certificate": "-----BEGIN " + "CERTIFICATE-----",
    "ids_and_paths": {"run_id": "run-1", "worker": "worker-a", "uri": "blob://tasks/1", "path": "/tmp/x"},
}


@pytest.mark.parametrize("value", NEGATIVES.values(), ids=NEGATIVES.keys())
def test_ordinary_values_are_not_credentials(value: Any) -> None:
    """Ordinary words, digests, token counts, references and empty credential fields are not reported."""
    assert find_credential(value) is None


def test_a_secret_used_as_an_object_key_is_found() -> None:
    """A secret hidden in a key is found, and the description does not repeat the key."""
    key = "ghp_" + ALNUM

    found = find_credential({"ok": {key: 1}})

    assert found is not None
    assert "GitHub token" in found
    assert key not in found


def test_the_first_credential_in_document_order_is_reported() -> None:
    """With several credentials, the first one met in document order is the one named."""
    found = find_credential([{"password": "a"}, "AKIA" + "Z7Q2X9W4V6U3T8S5"])

    assert found is not None
    assert "$[0].password" in found


def test_nesting_past_the_bound_fails_closed() -> None:
    """A value nested deeper than MAX_DEPTH cannot be screened completely, so it is reported."""
    deep: Any = "fine"
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]

    found = find_credential(deep)

    assert found is not None
    assert "deeper than" in found


def test_nesting_within_the_bound_is_screened() -> None:
    """At MAX_DEPTH levels of containers nothing is reported when nothing is there."""
    deep: Any = "fine"
    for _ in range(MAX_DEPTH):
        deep = [deep]

    assert find_credential(deep) is None


def test_too_many_nodes_fail_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A value with more nodes than the bound is reported rather than partly screened."""
    monkeypatch.setattr(credentials, "MAX_NODES", 10)

    assert find_credential(list(range(9))) is None
    found = find_credential(list(range(10)))
    assert found is not None
    assert "nodes" in found


def test_a_key_that_lower_cases_to_a_credential_name_is_found() -> None:
    """Keys compare as ``str.lower`` leaves them, so a Kelvin sign (lower-cased ``k``) does not hide a token."""
    found = find_credential({"args": {"to\u212aen": "abc"}})

    assert found is not None
    assert "credential-named key" in found
