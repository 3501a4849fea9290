"""The head statement that ends an export: where each exported stream ends, signed by the store.

An export's hash chain proves its events were not altered, but not that none were cut off the end,
nor that the whole chain was not rewritten and hashed again: anyone can seal a chain. The store
closes both gaps by signing, with its own Ed25519 key (docs/operations.md, "Store identity"), what
it recorded as each exported stream's head (position and digest, from its run rows), its id and
the time; a verifier holding the store's public key from a trusted channel then knows where every
stream must end and which digest it must end on.

The signed bytes are ``HEAD_PREFIX`` + the canonical encoding (``domain.canonical``) of the
statement without its signature, so a statement's signature never verifies as any other kind of
signature. In the export the statement is the last line: the same canonical encoding, signature
included, told from envelopes by its ``statement`` member.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from baton.domain.canonical import canonical_bytes

__all__ = ["HEAD_PREFIX", "HEAD_STATEMENT", "HeadStatement", "StreamHead", "signed_bytes", "statement_line"]

HEAD_STATEMENT = "baton.export-head.v1"
HEAD_PREFIX = b"baton.export-head.v1\x00"


class StreamHead(msgspec.Struct, frozen=True):
    """One exported stream's head as the store recorded it (its run row)."""

    run_id: str
    position: int
    digest: str


class HeadStatement(msgspec.Struct, frozen=True, tag_field="statement", tag=HEAD_STATEMENT):
    """What the store vouches for about one export.

    ``heads`` names every stream in the export, in file order (the principal registry first, when
    exported). ``scope`` is ``"store"`` for an export of every run the store holds: then ``heads`` is
    that set of runs, so a run left out of the file is found as surely as a cut tail.
    """

    store_id: str
    public_key: str  # ``ed25519:<base64>``, as ``baton store id`` prints it
    exported_at: int  # microseconds since the Unix epoch, the exporting process's clock
    scope: Literal["run", "store"]
    heads: tuple[StreamHead, ...]
    signature: str = ""  # base64 of the Ed25519 signature over ``signed_bytes``


def signed_bytes(statement: HeadStatement) -> bytes:
    """What the store's key signs: the prefix and the canonical statement without its signature."""
    unsigned = msgspec.to_builtins(statement)
    del unsigned["signature"]
    return HEAD_PREFIX + canonical_bytes(unsigned)


def statement_line(statement: HeadStatement) -> bytes:
    """The statement as the export's last line: canonical, signature included."""
    return canonical_bytes(statement)
