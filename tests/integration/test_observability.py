"""What ``baton serve`` tells an operator (issue 31): Prometheus counters after real submissions,
an OpenTelemetry span per submission from bus receipt to verdict, JSON log lines without colour.

Real NATS and a real SQLite store; the spans go to OpenTelemetry's in-memory exporter.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from bus_support import TIMEOUT, acquire, intent, open_run, request
from nats.aio.client import Client as NatsClient
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from serve_support import finished, serve, wait_for_line

from baton.adapters.bootstrap import init_store, open_ledger
from baton.adapters.bus import NatsBus, NatsOptions
from baton.adapters.bus.nats_app import REPLY_HEADER, durable_subject, submit_subject
from baton.adapters.observability import Telemetry
from baton.adapters.observability.telemetry import SPAN_NAME
from baton.adapters.wire import decode_verdict, encode_submission
from baton.domain.commands import Submission, Verdict

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"


@pytest.fixture
def sqlite_store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/observed.db"
    init_store(url, unsigned=True)
    return url


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def sample(metrics: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus' text format (labels in any order)."""
    for line in metrics.splitlines():
        found = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if found and dict(re.findall(r'(\w+)="([^"]*)"', found.group(1) or "")) == labels:
            return float(found.group(2))
    raise AssertionError(f"no sample {name}{labels} in:\n{metrics}")


async def submissions_with_every_outcome(nats_url: str) -> list[Verdict]:
    """Accepted, duplicate, malformed, a lease taken over after its ttl, and the old holder fenced."""
    nc = await nats.connect(nats_url)
    try:
        verdicts = [
            await request(nc, open_run("observed")),
            await request(nc, open_run("observed")),
            await request(nc, b"{not json", "observed"),
            await request(nc, acquire("observed", "w1", ttl_ms=1)),
        ]
        await asyncio.sleep(0.01)  # past w1's ttl
        verdicts.append(await request(nc, acquire("observed", "w2")))
        verdicts.append(await request(nc, intent("observed", "w1", 1, "op-1")))
        return verdicts
    finally:
        await nc.close()


def test_metrics_count_verdicts_by_reason_and_logs_are_json_without_colour(
    tmp_path: Path, sqlite_store: str, nats_url: str
) -> None:
    """Given serve with --metrics-port 0, when submissions of every outcome are answered, then
    /metrics counts them by verdict and reason with the append latency, the takeover and an empty
    queue, and stderr is JSON lines naming the rejected submission's run and id."""
    process = serve(tmp_path, "--bus", nats_url, "--store", sqlite_store, "--no-relay", "--metrics-port", "0")
    try:
        ready = wait_for_line(process, "ready on")
        url = re.search(r"metrics on (http://\S+/metrics)", ready)
        assert url is not None, ready

        verdicts = asyncio.run(submissions_with_every_outcome(nats_url))
        with urllib.request.urlopen(url.group(1), timeout=TIMEOUT) as response:
            metrics = response.read().decode()
    finally:
        process.send_signal(signal.SIGTERM)
    code, _, stderr, _ = finished(process, 5)

    assert [(v.verdict, v.reason) for v in verdicts] == [
        ("accepted", None),
        ("duplicate", None),
        ("rejected", "malformed"),
        ("accepted", None),
        ("accepted", None),
        ("rejected", "stale_epoch"),
    ]
    assert sample(metrics, "baton_verdicts_total", verdict="accepted", reason="") == 3
    assert sample(metrics, "baton_verdicts_total", verdict="duplicate", reason="") == 1
    assert sample(metrics, "baton_verdicts_total", verdict="rejected", reason="malformed") == 1
    assert sample(metrics, "baton_verdicts_total", verdict="rejected", reason="stale_epoch") == 1
    assert sample(metrics, "baton_lease_takeovers_total") == 1
    assert sample(metrics, "baton_queue_depth") == 0
    assert sample(metrics, "baton_append_seconds_count") >= 5  # every submission that reached the store
    assert sample(metrics, "baton_append_seconds_bucket", le="+Inf") == sample(metrics, "baton_append_seconds_count")

    assert code == 0, stderr
    assert "\x1b[" not in stderr
    lines = [json.loads(line) for line in stderr.splitlines()]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z", line["timestamp"]) for line in lines)
    stale = [line for line in lines if line.get("reason") == "stale_epoch"]
    assert stale == [stale[0]]
    assert stale[0]["event"] == "rejected"
    assert stale[0]["run_id"] == "observed"
    assert stale[0]["submission_id"] == "observed-w1-op-1"
    assert stale[0]["level"] == "info"


def test_a_busy_metrics_port_is_one_line_not_a_traceback(tmp_path: Path, sqlite_store: str, nats_url: str) -> None:
    """Given the metrics port already taken, when serve starts, then it exits 2 (bad settings) naming the address."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        args = ("--bus", nats_url, "--store", sqlite_store, "--metrics-port", str(port))
        code, stdout, stderr, _ = finished(serve(tmp_path, *args), 8)

    assert code == 2
    assert "ready" not in stdout
    assert "Traceback" not in stderr
    assert f"cannot serve metrics on 127.0.0.1:{port}" in stderr


async def requested(nc: NatsClient, item: Submission | bytes, run_id: str, headers: dict[str, str]) -> Verdict:
    raw = item if isinstance(item, bytes) else encode_submission(item)
    reply = await nc.request(submit_subject(run_id), raw, timeout=TIMEOUT, headers=headers)
    return decode_verdict(reply.data)


async def durably(nc: NatsClient, item: Submission) -> Verdict:
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    headers = {"Nats-Msg-Id": item.submission_id, REPLY_HEADER: inbox}
    await nc.jetstream().publish(durable_subject(item.run_id), encode_submission(item), headers=headers)
    return decode_verdict((await sub.next_msg(timeout=TIMEOUT)).data)


def by_submission(finished_spans: tuple[ReadableSpan, ...]) -> dict[str | None, ReadableSpan]:
    ours = [span for span in finished_spans if span.name == SPAN_NAME]
    return {str(span.attributes.get("baton.submission_id")) if span.attributes else None: span for span in ours}


def test_each_submission_is_a_span_from_receipt_to_verdict_under_the_workers_trace(
    sqlite_store: str, nats_url: str, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """Given a bus with a tracer provider, when a submission arrives with a traceparent, another on
    the durable stream and a third undecodable, then each is one span with the run id, submission
    id, verdict, reason and position, the first in the worker's trace."""
    provider, exporter = spans
    traced = {"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"}

    async def scenario() -> list[Verdict]:
        ledger = open_ledger(sqlite_store)
        try:
            bus = NatsBus(ledger, nats_url, NatsOptions(relay=False), telemetry=Telemetry(tracer_provider=provider))
            async with bus:
                nc = await nats.connect(nats_url)
                try:
                    return [
                        await requested(nc, open_run("traced"), "traced", traced),
                        await durably(nc, acquire("traced", "w1")),
                        await requested(nc, b"\xff", "traced", {}),
                    ]
                finally:
                    await nc.close()
        finally:
            ledger.close()

    verdicts = asyncio.run(scenario())
    found = by_submission(exporter.get_finished_spans())

    assert [v.verdict for v in verdicts] == ["accepted", "accepted", "rejected"]
    opened, acquired, undecodable = found["open-traced"], found["acquire-traced-w1"], found["None"]
    assert dict(opened.attributes or {}) == {
        "messaging.system": "nats",
        "baton.run_id": "traced",
        "baton.submission_id": "open-traced",
        "baton.verdict": "accepted",
        "baton.position": 1,
    }
    assert opened.context is not None and opened.parent is not None
    assert opened.context.trace_id == int(TRACE_ID, 16)
    assert opened.parent.span_id == int(PARENT_SPAN_ID, 16)
    assert opened.start_time is not None and opened.end_time is not None and opened.start_time < opened.end_time
    assert (acquired.attributes or {})["baton.position"] == 2
    assert acquired.parent is None  # no traceparent sent: a trace of its own
    assert (undecodable.attributes or {})["baton.reason"] == "malformed"
    assert len(found) == 3
