"""Claim receipts: the source store's signed word that a handoff moves to one store and no other.

A cross-store handoff names its destination store in the document. The destination claims the
prepared handoff in the source (``ClaimHandoff``, recorded once as ``HandoffClaimed``); the source
store then signs a ``ClaimReceipt`` with its identity key, and the destination imports only with
that receipt. One claim per document, so at most one store ever holds a valid receipt for it.

The receipt's signature is Ed25519 over ``receipt_bytes``: the canonical bytes of the receipt
without its signature, after a domain-separation prefix. This pure module shapes and reads the
bytes; signing and verifying need a cryptography library, which the adapters hold.
"""

from __future__ import annotations

import msgspec

from baton.domain import errors
from baton.domain.canonical import canonical_bytes

__all__ = ["RECEIPT_PREFIX", "ClaimReceipt", "decode_receipt", "receipt_bytes"]

RECEIPT_PREFIX = b"baton.claim-receipt.v1\x00"
MAX_RECEIPT_BYTES = 4096


class ClaimReceipt(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The source store ``source_store`` recorded, at ``position`` of run ``run_id``, that the
    handoff ``document_digest`` moves to ``for_store``; ``signature`` is its store key's."""

    run_id: str
    document_digest: str
    for_store: str
    source_store: str
    position: int
    signature: str = ""


def receipt_bytes(receipt: ClaimReceipt) -> bytes:
    """What the source store signs: the receipt's canonical bytes without the signature."""
    return RECEIPT_PREFIX + canonical_bytes(msgspec.structs.replace(receipt, signature=""))


def decode_receipt(text: str) -> ClaimReceipt:
    """A receipt from its JSON, or ``ClaimRequired`` naming what is wrong with it (bounded, closed)."""
    if len(text) > MAX_RECEIPT_BYTES:
        raise errors.ClaimRequired(f"a claim receipt is at most {MAX_RECEIPT_BYTES} bytes")
    try:
        receipt = msgspec.json.decode(text, type=ClaimReceipt, strict=False)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise errors.ClaimRequired(f"not a claim receipt: {exc}") from None
    if not receipt.signature:
        raise errors.ClaimRequired("the claim receipt is not signed")
    return receipt
