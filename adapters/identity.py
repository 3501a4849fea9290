"""Ed25519 keys and signatures for submissions (``cryptography``), on the rules of ``domain.identity``.

A key file is the private key in PKCS#8 PEM, readable by its owner only (mode 0600). A public key
is written ``ed25519:<base64 of the 32 raw bytes>``; a signature is the base64 of its 64 bytes.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from baton.domain import errors
from baton.domain.commands import Submission
from baton.domain.identity import KEY_PREFIX, signed_digest

__all__ = ["SigningKey", "verify_signature"]


class SigningKey:
    """A principal's private key: it signs submissions; ``public_key`` is what the registry holds."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        self.public_key = KEY_PREFIX + base64.b64encode(raw).decode()

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def read(cls, path: str | Path) -> SigningKey:
        """The key in ``path``; ``Malformed`` naming the file when it is not an Ed25519 private key."""
        try:
            loaded = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as exc:
            raise errors.Malformed(f"{path}: not a readable Ed25519 private key ({exc})") from None
        if not isinstance(loaded, Ed25519PrivateKey):
            raise errors.Malformed(f"{path}: not an Ed25519 private key")
        return cls(loaded)

    def write(self, path: str | Path) -> Path:
        """Write the key to a new file, mode 0600 from its creation; never over an existing file."""
        target = Path(path)
        pem = self._private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(pem)
        return target

    def sign(self, submission: Submission) -> Submission:
        """``submission`` as this key's owner sends it: ``signed_by`` this key, and its signature."""
        named = msgspec.structs.replace(submission, signed_by=self.public_key, signature="")
        signature = self._private.sign(signed_digest(named).encode())
        return msgspec.structs.replace(named, signature=base64.b64encode(signature).decode())


def verify_signature(public_key: str, submission: Submission) -> None:
    """Raise ``BadSignature`` unless ``submission.signature`` verifies with ``public_key``."""
    try:
        raw = base64.b64decode(public_key.removeprefix(KEY_PREFIX), validate=True)
        signature = base64.b64decode(submission.signature, validate=True)
        Ed25519PublicKey.from_public_bytes(raw).verify(signature, signed_digest(submission).encode())
    except (InvalidSignature, ValueError) as exc:
        raise errors.BadSignature(f"the signature of {submission.submission_id!r} does not verify") from exc
