"""The store's identity: an Ed25519 key made once, by the migration that creates ``baton_store``.

A store needs a secret of its own to tell the snapshots it wrote from rows someone else put in
its snapshot table (``snapshots``), and a public key others can check what it signs by (the head
statements that end its exports, claim receipts; issue 30). Both come from one key, kept in the
store itself: whoever can read ``baton_store`` holds the store's authority, so restrict that table
(docs/operations.md).

The id is derived from the public key (``store-`` and 32 hex digits of a domain-separated
SHA-256), so an id and a key that do not belong together are told apart without a registry.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import NamedTuple

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from baton.domain.identity import KEY_PREFIX

__all__ = ["StoreIdentity", "new_identity", "raw_public_key", "store_id_of", "verify_store_signature"]

_ID_PREFIX = b"baton.store-id.v1\x00"
_SNAPSHOT_KEY_LABEL = b"baton.snapshot-key.v1"


class StoreIdentity(NamedTuple):
    store_id: str
    public_key: str  # ``ed25519:<base64 of the 32 raw bytes>``, as principals' keys are written
    private_key: bytes  # the 32 raw bytes: never printed, never leaves the store but to sign

    def snapshot_key(self) -> bytes:
        """The HMAC key of snapshot tags: derived, so the signing key itself never keys a MAC."""
        return hmac.digest(self.private_key, _SNAPSHOT_KEY_LABEL, "sha256")

    def sign(self, data: bytes) -> str:
        """The base64 Ed25519 signature of ``data``; ``data`` carries its own domain-separation prefix."""
        return base64.b64encode(Ed25519PrivateKey.from_private_bytes(self.private_key).sign(data)).decode()

    def __repr__(self) -> str:  # a traceback or a log line must not carry the private key
        return f"StoreIdentity({self.store_id!r}, {self.public_key!r})"


def new_identity() -> StoreIdentity:
    private = Ed25519PrivateKey.generate()
    raw_public = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    raw_private = private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return StoreIdentity(store_id_of(raw_public), KEY_PREFIX + base64.b64encode(raw_public).decode(), raw_private)


def store_id_of(raw_public: bytes) -> str:
    return "store-" + hashlib.sha256(_ID_PREFIX + raw_public).hexdigest()[:32]


def raw_public_key(public_key: str) -> bytes:
    """The 32 raw bytes of ``ed25519:<base64>``; ValueError for anything else."""
    if not public_key.startswith(KEY_PREFIX):
        raise ValueError(f"a store's public key is {KEY_PREFIX}<base64 of 32 bytes>")
    try:
        raw = base64.b64decode(public_key.removeprefix(KEY_PREFIX), validate=True)
    except binascii.Error:
        raise ValueError(f"a store's public key is {KEY_PREFIX}<base64 of 32 bytes>") from None
    if len(raw) != 32:
        raise ValueError(f"a store's public key is {KEY_PREFIX}<base64 of 32 bytes>, not {len(raw)} bytes")
    return raw


def verify_store_signature(public_key: str, signature: str, data: bytes) -> bool:
    """Whether ``signature`` (base64) is the key ``public_key``'s over ``data``."""
    try:
        key = Ed25519PublicKey.from_public_bytes(raw_public_key(public_key))
        key.verify(base64.b64decode(signature, validate=True), data)
    except (InvalidSignature, ValueError):  # binascii.Error is a ValueError
        return False
    return True
