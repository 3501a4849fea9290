"""Claim receipts signed and checked with store identity keys (``domain.receipts`` shapes them).

The source store signs a receipt with its identity key when a handoff is claimed for another
store; the destination's ledger checks, before it decides an import, that the receipt is signed
by the key its caller trusts, that the key is the source store's (its id derives from the key),
and that the receipt names this very store.
"""

from __future__ import annotations

import base64

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from baton.adapters.eventstore.store_identity import StoreIdentity, store_id_of
from baton.domain import errors
from baton.domain.commands import AcceptHandoff
from baton.domain.identity import KEY_PREFIX
from baton.domain.receipts import ClaimReceipt, decode_receipt, receipt_bytes

__all__ = ["check_claim", "sign_receipt"]


def sign_receipt(identity: StoreIdentity, receipt: ClaimReceipt) -> ClaimReceipt:
    """``receipt`` signed by the source store ``identity`` (Ed25519 is deterministic: signing the
    same claim again gives the same receipt, so a lost reply is simply asked for again)."""
    private = Ed25519PrivateKey.from_private_bytes(identity.private_key)
    unsigned = msgspec.structs.replace(receipt, source_store=identity.store_id, signature="")
    signature = base64.b64encode(private.sign(receipt_bytes(unsigned))).decode()
    return msgspec.structs.replace(unsigned, signature=signature)


def check_claim(command: AcceptHandoff, this_store: str) -> None:
    """The import's receipt is the trusted source store's and claims the run for ``this_store``.

    ``ClaimRequired`` without a receipt or a trusted key, ``ClaimNotForThisStore`` for a receipt
    naming another store, ``BadSignature`` for one the trusted key did not sign. What the receipt
    binds (run, document, the document's store) the domain checks when it decides.
    """
    if not command.receipt:
        raise errors.ClaimRequired("an import needs the source's claim receipt (baton handoff claim)")
    receipt = decode_receipt(command.receipt)
    if receipt.for_store != this_store:
        raise errors.ClaimNotForThisStore(f"the receipt claims the run for store {receipt.for_store}, not {this_store}")
    if not command.trust:
        raise errors.ClaimRequired("an import needs the source store's public key to trust (--trust)")
    try:
        raw = base64.b64decode(command.trust.removeprefix(KEY_PREFIX), validate=True)
        key = Ed25519PublicKey.from_public_bytes(raw)
        key.verify(base64.b64decode(receipt.signature, validate=True), receipt_bytes(receipt))
    except (InvalidSignature, ValueError):
        raise errors.BadSignature("the claim receipt is not signed by the trusted source store key") from None
    if store_id_of(raw) != receipt.source_store:
        raise errors.BadSignature(f"the trusted key is not store {receipt.source_store}'s")
