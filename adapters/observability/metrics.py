"""The Prometheus metrics of one ``baton serve`` process, in a registry of their own.

Their own ``CollectorRegistry``, not the library's global one: two services in one process (the
tests) or an embedding application's metrics never mix with these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

__all__ = ["APPEND_BUCKETS", "MetricsServer", "ServiceMetrics"]

# Seconds: a local SQLite commit takes well under a millisecond, a PostgreSQL one a few
# milliseconds, a store in trouble seconds.
APPEND_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ServiceMetrics:
    """Verdicts by reason, store append latency, submissions in flight, lease takeovers."""

    def __init__(self, *, takeovers: Callable[[], int] = lambda: 0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.verdicts = Counter(
            "baton_verdicts",
            "Verdicts answered, by verdict and reason (reason is empty for accepted and duplicate).",
            ["verdict", "reason"],
            registry=self.registry,
        )
        self.append_seconds = Histogram(
            "baton_append_seconds",
            "Time of one store call deciding and appending a batch of submissions (group commit).",
            buckets=APPEND_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "baton_append_batch_size",
            "Submissions decided in one store call.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "baton_queue_depth",
            "Submissions received and not yet answered: waiting for a store call or in one.",
            registry=self.registry,
        )
        self.registry.register(_Takeovers(takeovers))


class _Takeovers(Collector):
    """Read from the ledger at scrape time: it counts the leases its appends ended by force."""

    def __init__(self, read: Callable[[], int]) -> None:
        self.read = read

    def collect(self) -> Any:
        family = CounterMetricFamily(
            "baton_lease_takeovers",
            "Leases this process's appends ended by force (ttl passed or holder's session gone), "
            "each letting another worker take the run over.",
        )
        family.add_metric([], self.read())
        yield family


class MetricsServer:
    """``/metrics`` over HTTP on ``host:port`` (prometheus-client's own server, in its own thread)."""

    def __init__(self, metrics: ServiceMetrics, port: int, host: str = "127.0.0.1") -> None:
        self._server, self._thread = start_http_server(port, addr=host, registry=metrics.registry)
        self.host = host
        self.port: int = self._server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
