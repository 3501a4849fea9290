"""Bus URLs: ``nats://host:port[,host:port...]`` or ``kafka://host:port[,host:port...]``.

One scheme, then every seed address of a cluster, comma-separated: the form ``baton serve --bus``
and the worker clients take. The clients learn the rest of a cluster from the server they reach.
"""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["addresses", "servers"]

_DEFAULT_PORTS = {"kafka": 9092, "nats": 4222, "tls": 4222}


def servers(url: str) -> list[str]:
    """``nats://a:4222,b:4222`` -> ``["nats://a:4222", "nats://b:4222"]`` (nats-py's ``servers``)."""
    scheme, _, rest = url.partition("://")
    return [f"{scheme}://{server.strip()}" for server in rest.split(",") if server.strip()]


def addresses(url: str) -> list[tuple[str, int]]:
    """``kafka://a,b:9093`` -> ``[("a", 9092), ("b", 9093)]``: each seed's host and port."""
    found = []
    for server in servers(url):
        parts = urlsplit(server)
        found.append((parts.hostname or "127.0.0.1", parts.port or _DEFAULT_PORTS.get(parts.scheme, 4222)))
    return found
