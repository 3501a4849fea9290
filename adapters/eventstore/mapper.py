"""A msgspec mapper between Baton's recorded events and eventsourcing's stored events.

The stored ``state`` is the envelope's *stored form* (``domain.chain.stored_form``): the canonical
bytes its digest covers plus the digest as a last member, made once by ``seal_stored``; an auditor
verifies the bytes in the table without re-encoding them. Decoding is lenient about integers
(the stored form writes them as decimal strings; stores written before it hold JSON numbers) and
takes a typed fast path unless the event class has moved past version 1, in which case the
library's upcast loop (``upcast_vN_vN+1``) rewrites the body first.
"""

from __future__ import annotations

from typing import Any

import msgspec
from eventsourcing.persistence import Mapper, StoredEvent

from baton.domain.events import EVENT_TYPES, RecordedEvent

__all__ = ["MsgspecMapper", "StoredRunEvent", "TOPIC_PREFIX"]

TOPIC_PREFIX = "domain.events:"

_typed = msgspec.json.Decoder(RecordedEvent, strict=False)
_generic = msgspec.json.Decoder()


class StoredRunEvent(msgspec.Struct, frozen=True, gc=False):
    """A recorded envelope and its stored form, as the stored event itself: appending maps nothing.

    The ledger hands these to the recorder as they are: each has the four fields the recorders read
    (those of a ``StoredEvent``), and the envelope it was sealed from. It is a Struct the cycle
    collector never tracks (``gc=False``): every field is a string, an int, bytes or an untracked
    envelope, so it can be in no cycle, and a large batch waiting to be written adds nothing to
    the collector's work.
    """

    originator_id: str
    originator_version: int
    topic: str
    state: bytes
    recorded: RecordedEvent

    @classmethod
    def of(cls, recorded: RecordedEvent, stored: bytes) -> StoredRunEvent:
        body = type(recorded.body)
        topic = _TOPICS.get(body) or _TOPICS.setdefault(body, TOPIC_PREFIX + body.__name__)
        return cls(recorded.run_id, recorded.position, topic, stored, recorded)


_TOPICS: dict[type, str] = {}


class MsgspecMapper(Mapper[str]):
    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        if type(domain_event) is not StoredRunEvent:
            raise TypeError(f"the ledger appends StoredRunEvent, not {type(domain_event).__name__}")
        return StoredEvent(
            domain_event.originator_id, domain_event.originator_version, domain_event.topic, domain_event.state
        )

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        return StoredRunEvent.of(decode_recorded(stored_event.topic, stored_event.state), stored_event.state)


def decode_recorded(topic: str, state: bytes) -> RecordedEvent:
    """Decode stored bytes into an envelope, upcasting old event versions on the way."""
    cls = EVENT_TYPES.get(topic.removeprefix(TOPIC_PREFIX))
    if cls is None or cls.class_version == 1:
        return _typed.decode(state)
    envelope = _generic.decode(state)
    body: dict[str, Any] = envelope["body"]
    version = int(body.get("class_version", 1))
    while version < cls.class_version:
        getattr(cls, f"upcast_v{version}_v{version + 1}")(body)
        version += 1
    return msgspec.convert(envelope, RecordedEvent, strict=False)
