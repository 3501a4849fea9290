"""The AsyncAPI document of ``baton serve`` (both buses), for ``faststream docs gen``.

Regenerate the committed copy with::

    PYTHONHASHSEED=0 faststream docs gen adapters.bus.asyncapi:spec --yaml --out docs/asyncapi.yaml  # fixed order

The brokers are built for description only: nothing connects and no ledger is opened.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from faststream import FastStream
from faststream.specification import AsyncAPI

from baton.adapters.bus.kafka_app import KafkaBus
from baton.adapters.bus.nats_app import NatsBus, describe_nats_consumers
from baton.domain.commands import Submission, Verdict
from baton.domain.errors import StoreUnavailable
from baton.domain.events import RecordedEvent

__all__ = ["spec"]


_NO_STORE = "the AsyncAPI document is built without a store: nothing can be submitted through it"


class _NoLedger:
    """Satisfies the ``Ledger`` port for building the apps; documentation never submits."""

    def submit(self, submission: Submission) -> Verdict:
        raise StoreUnavailable(_NO_STORE)

    def submit_many(self, submissions: Sequence[Submission]) -> list[Verdict]:
        raise StoreUnavailable(_NO_STORE)

    def all_events(self, *, after: int = 0, page: int = 1000) -> Iterator[tuple[int, RecordedEvent]]:
        raise StoreUnavailable(_NO_STORE)

    lease_takeovers = 0

    def relay_leader(self) -> bool:
        raise StoreUnavailable(_NO_STORE)


_nats = NatsBus(_NoLedger(), "nats://localhost:4222").broker
describe_nats_consumers(_nats)

spec = FastStream(
    _nats,
    KafkaBus(_NoLedger(), "localhost:9092").broker,
    specification=AsyncAPI(
        title="Baton ledger service",
        version="1",
        description=(
            "`baton serve`: workers submit to a run's ledger over NATS (request-reply, or durable JetStream) "
            "or Kafka and get a verdict; committed events are relayed from the log at least once. "
            "Payloads are the JSON of `baton schema submission|verdict|event`. See docs/operations.md."
        ),
    ),
)
