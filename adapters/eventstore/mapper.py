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

from domain.events import EVENT_TYPES, RecordedEvent

__all__ = ["MsgspecMapper", "StoredRunEvent", "TOPIC_PREFIX"]

TOPIC_PREFIX = "domain.events:"

_typed = msgspec.json.Decoder(RecordedEvent, strict=False)
_generic = msgspec.json.Decoder()


class StoredRunEvent:
    """The minimal domain-event protocol eventsourcing needs: one recorded envelope and its stored form."""

    __slots__ = ("originator_id", "originator_version", "recorded", "stored")

    def __init__(self, recorded: RecordedEvent, stored: bytes) -> None:
        self.recorded = recorded
        self.stored = stored
        self.originator_id = recorded.run_id
        self.originator_version = recorded.position


class MsgspecMapper(Mapper[str]):
    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        recorded: RecordedEvent = domain_event.recorded
        return StoredEvent(
            originator_id=recorded.run_id,
            originator_version=recorded.position,
            topic=TOPIC_PREFIX + type(recorded.body).__name__,
            state=domain_event.stored,
        )

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        return StoredRunEvent(decode_recorded(stored_event.topic, stored_event.state), stored_event.state)


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
