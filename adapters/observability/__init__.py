"""What ``baton serve`` tells an operator: Prometheus metrics, OpenTelemetry spans, structured logs.

Each uses its ecosystem's own library; Baton only names what is measured (docs/operations.md,
"Metrics, traces and logs").
"""

from baton.adapters.observability.logs import configure_logging
from baton.adapters.observability.metrics import MetricsServer, ServiceMetrics
from baton.adapters.observability.telemetry import Telemetry

__all__ = ["MetricsServer", "ServiceMetrics", "Telemetry", "configure_logging"]
