"""The mapper's upcast loop: a stored body of an older class version is rewritten, step by step, before decoding.

No event class has moved past version 1 yet, so these tests move one (``LeaseExpired``) to version 3
for their duration, with the two upcasters ``docs/events.md`` ("Evolution rules") asks for.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from baton.adapters.eventstore.mapper import TOPIC_PREFIX, decode_recorded
from baton.domain.events import LeaseExpired

TOPIC = TOPIC_PREFIX + "LeaseExpired"


def stored(body: dict[str, Any]) -> bytes:
    """A stored envelope around ``body``, integers as decimal strings as the stored form writes them."""
    envelope = {
        "run_id": "run-1",
        "position": "7",
        "epoch": "1",
        "worker": "store",
        "submission_id": "sub-7",
        "recorded_at": "1700000000000000",
        "prev_digest": "sha256:" + "0" * 64,
        "body": body,
        "digest": "sha256:" + "1" * 64,
    }
    return msgspec.json.encode(envelope)


@pytest.fixture
def lease_expired_at_version_3(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``LeaseExpired`` as if its body had been renamed twice: v1 ``holder``/``at``, v2 ``worker``/``at``, v3 now."""
    calls: list[str] = []

    def v1_v2(body: dict[str, Any]) -> None:
        calls.append("v1->v2")
        body["worker"] = body.pop("holder")

    def v2_v3(body: dict[str, Any]) -> None:
        calls.append("v2->v3")
        body["expired_at"] = int(body.pop("at"))  # as stored: a decimal string, or a JSON number in older stores
        body.pop("class_version", None)  # a real version-3 class would store it as a field; this one has none

    monkeypatch.setattr(LeaseExpired, "class_version", 3)
    monkeypatch.setattr(LeaseExpired, "upcast_v1_v2", staticmethod(v1_v2), raising=False)
    monkeypatch.setattr(LeaseExpired, "upcast_v2_v3", staticmethod(v2_v3), raising=False)
    return calls


def test_a_version_1_body_runs_every_upcaster_in_order(lease_expired_at_version_3: list[str]) -> None:
    """Given a body stored at version 1 (no ``class_version`` member), when decoded by a version-3 class,
    then both upcasters ran, in order, and the event reads as version 3."""
    state = stored({"type": "LeaseExpired", "holder": "worker-a", "epoch": "1", "at": "1700000000000001"})

    recorded = decode_recorded(TOPIC, state)

    assert lease_expired_at_version_3 == ["v1->v2", "v2->v3"]
    assert recorded.body == LeaseExpired(worker="worker-a", epoch=1, expired_at=1700000000000001)
    assert (recorded.position, recorded.run_id) == (7, "run-1")


def test_a_body_stored_at_version_2_runs_only_the_later_upcaster(lease_expired_at_version_3: list[str]) -> None:
    """Given a body whose stored ``class_version`` is 2, when decoded, then only v2->v3 ran."""
    body = {"type": "LeaseExpired", "class_version": "2", "worker": "worker-b", "epoch": "2", "at": 42}

    recorded = decode_recorded(TOPIC, stored(body))

    assert lease_expired_at_version_3 == ["v2->v3"]
    assert recorded.body == LeaseExpired(worker="worker-b", epoch=2, expired_at=42)


def test_a_version_1_class_decodes_on_the_typed_path_without_upcasting() -> None:
    """Given ``LeaseExpired`` at version 1 and a body with a member it does not know, when decoded,
    then it is refused (unknown fields are forbidden), not rewritten."""
    state = stored({"type": "LeaseExpired", "holder": "worker-a", "epoch": "1", "at": "5"})

    with pytest.raises(msgspec.ValidationError, match="holder"):
        decode_recorded(TOPIC, state)
