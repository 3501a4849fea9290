"""The ledger service on a message bus (``baton serve``): NATS or Kafka, the same semantics.

Thin by design: decode at the edge (``adapters.wire``), submit with group commit
(``service.py``), answer with a verdict; committed events are relayed from the log (``relay.py``).
This package never imports the event store: it takes the ledger as a parameter (``Ledger``).
"""

from baton.adapters.bus.kafka_app import KafkaBus, KafkaOptions
from baton.adapters.bus.nats_app import (
    NatsBus,
    NatsOptions,
    durable_subject,
    events_subject,
    partition_mapping,
    partition_subject,
    submit_subject,
)
from baton.adapters.bus.relay import EventRelay
from baton.adapters.bus.runner import build_bus, serve
from baton.adapters.bus.service import Ledger, SubmissionService

__all__ = [
    "EventRelay",
    "KafkaBus",
    "KafkaOptions",
    "Ledger",
    "NatsBus",
    "NatsOptions",
    "SubmissionService",
    "build_bus",
    "durable_subject",
    "events_subject",
    "partition_mapping",
    "partition_subject",
    "serve",
    "submit_subject",
]
