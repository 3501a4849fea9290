"""A checkpoint's document: the one blob a ``CheckpointRecorded`` event names by digest.

Its bytes are the saver's to write and the index's and purge's to read, so its format lives here,
apart from both.
"""

from __future__ import annotations

import msgspec

__all__ = ["Document", "decode_document", "referenced_digests"]


class Document(msgspec.Struct, frozen=True, array_like=True):
    """A checkpoint's blob: serialized checkpoint (without values), metadata, and channel values.

    A value is a blob by digest, or (``inline``) its bytes themselves when they are no longer
    than a digest would be: no blob row to write, and the document's digest covers them all the same.
    """

    checkpoint: tuple[str, bytes]
    metadata: tuple[str, bytes]
    metadata_json: bytes  # metadata as JSON, what ``list(filter=...)`` matches
    channels: dict[str, tuple[str, str]]  # channel -> (serializer type, blob digest)
    inline: dict[str, tuple[str, bytes]] = {}  # channel -> (serializer type, value); new in v2, old docs lack it


_doc_decoder = msgspec.msgpack.Decoder(Document)


def decode_document(data: bytes) -> Document:
    return _doc_decoder.decode(data)


def referenced_digests(document: bytes) -> list[str]:
    doc = decode_document(document)
    return sorted({digest for _, digest in doc.channels.values()})
