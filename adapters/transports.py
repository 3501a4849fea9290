"""A worker's transport from a bus URL: what ``baton serve --bus URL`` serves, the worker reaches.

``nats://`` (or ``tls://``) gives ``NatsTransport``, ``kafka://host:port[,host:port...]`` gives
``KafkaTransport``; both raise ``StoreUnavailable`` when a verdict does not come, so ``Worker``
retries the same submission id on either.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from baton.adapters.kafka_transport import KafkaTransport
from baton.adapters.worker import NatsTransport

__all__ = ["connect_transport"]


def connect_transport(bus_url: str, *, timeout: float = 10.0) -> NatsTransport | KafkaTransport:
    """The transport for ``bus_url``; the caller closes it (``close()``) after the worker."""
    scheme = urlsplit(bus_url).scheme
    if scheme in {"nats", "tls"}:
        return NatsTransport(bus_url, timeout=timeout)
    if scheme == "kafka":
        return KafkaTransport(bus_url, timeout=timeout)
    raise ValueError(f"unsupported bus URL {bus_url!r}: use nats://HOST:PORT or kafka://HOST:PORT")
