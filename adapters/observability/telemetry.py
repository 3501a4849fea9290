"""The hooks ``SubmissionService`` calls: a span per submission, from bus receipt to verdict, and
the metrics beside it.

A span starts when the transport hands the submission over and ends when its verdict is handed
back, with the run id, submission id, verdict, reason and position. Its parent is the
``traceparent`` the worker sent in the message headers (W3C trace context), else the span current
at receipt: on Kafka, the consume span of FastStream's ``KafkaTelemetryMiddleware``. The NATS paths
are plain nats-py consumers (``bus/nats_consumers.py``), where FastStream's middleware does not
apply, so their spans start here.

Spans go to the tracer provider given, else OpenTelemetry's global one: without an SDK configured
(``opentelemetry-instrument``, or an application that sets one) they are the API's no-op spans.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider

from baton.adapters.observability.metrics import ServiceMetrics
from baton.domain import errors
from baton.domain.commands import Submission, Verdict

__all__ = ["SPAN_NAME", "Telemetry"]

SPAN_NAME = "baton submit"

log = logging.getLogger("baton.verdicts")


class Telemetry:
    """Spans always (no-op without an SDK); metrics when ``metrics`` is given (``--metrics-port``)."""

    def __init__(
        self,
        *,
        metrics: ServiceMetrics | None = None,
        tracer_provider: TracerProvider | None = None,
        system: str = "nats",
    ) -> None:
        self.metrics = metrics
        self.tracer_provider = tracer_provider  # None: OpenTelemetry's global one
        self.tracer = trace.get_tracer("baton", tracer_provider=tracer_provider)
        self.system = system

    def received(self, submission: Submission, headers: Mapping[str, str] | None) -> Span:
        """A submission was handed over for a verdict: its span starts."""
        if self.metrics is not None:
            self.metrics.queue_depth.inc()
        return self._span(submission.run_id, submission.submission_id, headers)

    def answered(self, spans: Sequence[Span], verdicts: Sequence[Verdict]) -> None:
        """The verdicts of received submissions were handed back: their spans end."""
        if self.metrics is not None:
            self.metrics.queue_depth.dec(len(spans))
        for span, verdict in zip(spans, verdicts, strict=True):
            self._end(span, verdict)

    def abandoned(self, spans: Sequence[Span], exc: BaseException) -> None:
        """Received submissions got no verdict (the service stopping, or a bug)."""
        if self.metrics is not None:
            self.metrics.queue_depth.dec(len(spans))
        for span in spans:
            span.set_status(Status(StatusCode.ERROR, f"no verdict: {type(exc).__name__}"))
            span.end()

    def refused(self, verdict: Verdict, headers: Mapping[str, str] | None) -> None:
        """A message rejected on receipt (undecodable, or addressed to another run): a span of its own."""
        self._end(self._span(verdict.run_id, verdict.submission_id, headers), verdict)

    def appended(self, seconds: float, size: int) -> None:
        """One store call decided ``size`` submissions in ``seconds`` (runs in a ledger thread)."""
        if self.metrics is not None:
            self.metrics.append_seconds.observe(seconds)
            self.metrics.batch_size.observe(size)

    def _span(self, run_id: str | None, submission_id: str | None, headers: Mapping[str, str] | None) -> Span:
        parent = propagate.extract(headers) if headers and "traceparent" in headers else None
        attributes = {"messaging.system": self.system}
        if run_id is not None:
            attributes["baton.run_id"] = run_id
        if submission_id is not None:
            attributes["baton.submission_id"] = submission_id
        return self.tracer.start_span(SPAN_NAME, context=parent, kind=SpanKind.CONSUMER, attributes=attributes)

    def _end(self, span: Span, verdict: Verdict) -> None:
        if self.metrics is not None:
            self.metrics.verdicts.labels(verdict.verdict, verdict.reason or "").inc()
        _log(verdict)
        if span.is_recording():
            span.set_attribute("baton.verdict", verdict.verdict)
            if verdict.reason is not None:
                span.set_attribute("baton.reason", verdict.reason)
            if verdict.position is not None:
                span.set_attribute("baton.position", verdict.position)
            if verdict.reason == errors.StoreUnavailable.reason:
                span.set_status(Status(StatusCode.ERROR, verdict.message))
        span.end()


def _log(verdict: Verdict) -> None:
    """A rejection is logged (a store outage as a warning); an acceptance only at DEBUG."""
    if verdict.verdict == "rejected":
        level = logging.WARNING if verdict.reason == errors.StoreUnavailable.reason else logging.INFO
    else:
        level = logging.DEBUG
    if log.isEnabledFor(level):
        fields = {"run_id": verdict.run_id, "submission_id": verdict.submission_id, "position": verdict.position}
        if verdict.reason is not None:
            fields |= {"reason": verdict.reason, "detail": verdict.message}
        log.log(level, verdict.verdict, extra=fields)
