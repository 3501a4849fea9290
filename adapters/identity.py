"""Ed25519 keys and signatures for submissions (``cryptography``), on the rules of ``domain.identity``.

A key file is the private key in PKCS#8 PEM, readable by its owner only (mode 0600). A public key
is written ``ed25519:<base64 of the 32 raw bytes>``; a signature is the base64 of its 64 bytes.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from baton.domain import errors
from baton.domain.canonical import canonical_bytes
from baton.domain.commands import Submission
from baton.domain.events import PrincipalAdded, PrincipalRevoked, RecordedEvent, RegistryOpened
from baton.domain.identity import KEY_PREFIX, content_digest, signed_digest

__all__ = ["RegistryHistory", "SigningKey", "verify_signature"]


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


def verify_signature(public_key: str, submission: Submission) -> str:
    """The submission's ``signed_digest``; ``BadSignature`` unless its signature verifies with ``public_key``."""
    digest = signed_digest(submission)
    if not _verifies(public_key, submission.signature, digest):
        raise errors.BadSignature(f"the signature of {submission.submission_id!r} does not verify")
    return digest


def _verifies(public_key: str, signature: str, digest: str) -> bool:
    """Whether ``signature`` (base64) is ``public_key``'s over ``digest`` (what a principal signs)."""
    try:
        raw = base64.b64decode(public_key.removeprefix(KEY_PREFIX), validate=True)
        Ed25519PublicKey.from_public_bytes(raw).verify(base64.b64decode(signature, validate=True), digest.encode())
    except (InvalidSignature, ValueError):
        return False
    return True


class RegistryHistory:
    """The registry as it was over time, read from its events: who wrote each event, checked offline.

    For the audit (``projections.audit.AuditFold``'s ``authorship``): in a store whose registry
    requires signatures, every event must be signed except those the registry's opening lists as
    already in the store (``RegistryOpened.existing``: its runs and their heads), by a principal
    added no later than the event and not revoked before it (by the store's clock), with a
    signature that verifies over its ``signed_digest``.
    """

    def __init__(self, events: Iterable[RecordedEvent]) -> None:
        self._submission: tuple[str, str, str] | None = None  # (run, submission id, signed digest) being read
        self.required = False
        self.existing: dict[str, int] = {}
        self.keys: dict[str, str] = {}
        self.added: dict[str, int] = {}
        self.revoked: dict[str, int] = {}
        for event in events:
            body = event.body
            if isinstance(body, RegistryOpened) and body.signatures_required:
                self.required, self.existing = True, dict(body.existing)
            elif isinstance(body, PrincipalAdded):
                self.keys[body.name], self.added[body.name] = body.public_key, event.recorded_at
            elif isinstance(body, PrincipalRevoked):
                self.revoked[body.name] = event.recorded_at

    def __call__(self, event: RecordedEvent) -> tuple[str, str] | None:
        if not self.required or event.position <= self.existing.get(event.run_id, 0):
            return None
        if not event.signature:
            return "unsigned", f"{event.type} from {event.worker!r} carries no signature"
        key, added = self.keys.get(event.worker), self.added.get(event.worker)
        if key is None or added is None or added > event.recorded_at:
            return "unknown_principal", f"{event.type} signed for {event.worker!r}, not in the registry then"
        revoked = self.revoked.get(event.worker)
        if revoked is not None and event.recorded_at > revoked:
            return "principal_revoked", f"{event.type} from {event.worker!r} after its revocation"
        if not _verifies(key, event.signature, event.signed_digest):
            return "bad_signature", f"{event.type}'s signature does not verify with {event.worker!r}'s key"
        return self._content(event)

    def _content(self, event: RecordedEvent) -> tuple[str, str] | None:
        """The events of a signed submission are what it asked for: its first keeps the signed content,
        whose digest is the one signed; the envelope names its run, author and id; the body's fields
        that the command also has hold the command's values; its later events carry the same digest."""
        ongoing = self._submission
        if ongoing is not None and ongoing[:2] == (event.run_id, event.submission_id):
            if event.signed_digest != ongoing[2]:
                return "signed_content_mismatch", f"{event.type} carries another signed digest than its submission"
            return None
        self._submission = (event.run_id, event.submission_id, event.signed_digest)
        content = event.signed_submission
        if content is None or content_digest(content) != event.signed_digest:
            return "signed_content_mismatch", f"{event.type}: the signed submission is missing or not the one signed"
        named = (content.get("run_id"), content.get("worker"), content.get("submission_id"))
        if named != (event.run_id, event.worker, event.submission_id):
            return (
                "signed_content_mismatch",
                f"{event.type}: the envelope names another run, author or id than was signed",
            )
        command: dict[str, Any] = content.get("command") or {}
        body: dict[str, Any] = msgspec.to_builtins(event.body)
        for name, value in command.items():
            if name == "type" or name not in body or (command.get("type"), name) in _TRANSFORMED:
                continue
            if canonical_bytes({name: body[name]}) != canonical_bytes({name: value}):
                return "signed_content_mismatch", f"{event.type}.{name} is not what the signed submission asked"
        return None


# command fields whose event field of the same name the ledger rewrites (a purge's tombstone reason)
_TRANSFORMED = frozenset({("purge_thread", "reason")})
