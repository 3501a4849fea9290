"""The worker client (adapters/worker.py): the same story in-process and over NATS.

Given a worker that records its work and hands the run to another, when the old worker appends
again, then it gets the domain's own ``StaleEpoch``; the new one resumes from the log, replaying
without calling the outside world.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bus_support import BackgroundLoop

from baton.adapters.bootstrap import init_store, open_ledger
from baton.adapters.bus import NatsBus
from baton.adapters.eventstore import RunLedger
from baton.adapters.worker import LedgerTransport, NatsTransport, Transport, Worker
from baton.domain import errors
from baton.domain.events import IntentContext, Placement
from baton.domain.stages import Stage
from baton.projections.audit import audit_events
from baton.projections.resumability import ResumabilityClass

RUN = "worker-client-run"
STATE: dict[str, Any] = {"goal": "summarise the incident", "candidates": []}
TOOLS = ("search@1",)


def story(reader: RunLedger, transport: Transport) -> None:
    a = Worker(Placement("a", tool_contracts=TOOLS), transport, reader)
    b = Worker(Placement("b", tool_contracts=TOOLS), transport, reader)
    a.open_run(RUN, "rel-1", ("coding-agent", 1), STATE)
    assert a.acquire(RUN) == 1
    context = IntentContext(1, "search", effect="read", arguments={"q": "incident 42"})
    with a.heartbeat(RUN, every_s=0.05):
        a.reserve(RUN, "stage-1", 5)
        a.intend(RUN, "op-1", "search@1", context)
        a.observe(RUN, "op-1", context, result={"hits": 3})
        a.transition(RUN, Stage.CANDIDATE_READY, STATE)
        a.seal(RUN, "ckpt-1", STATE)

    prepared = a.hand_off(RUN, b.placement, STATE, to_version=2)
    assert b.accept(prepared.document, prepared.digest) == 2

    with pytest.raises(errors.StaleEpoch) as stale:
        a.intend(RUN, "op-late", "search@1", context)
    assert stale.value.current_epoch == 2
    resumed = b.resume(RUN)
    assert resumed.resumability.cls in {ResumabilityClass.R2, ResumabilityClass.R3}
    assert resumed.checkpoint.state_schema_version == 2 and resumed.checkpoint.owner == "b"
    assert resumed.cursor.consumed  # the sealed checkpoint covers op-1: nothing to replay
    with pytest.raises(errors.UnknownOperation):
        b.observe(RUN, "op-never", context)
    assert audit_events(RUN, list(reader.history(RUN))) == []


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[RunLedger]:
    url = f"sqlite:///{tmp_path / 'worker.db'}"
    init_store(url)
    opened = open_ledger(url)
    yield opened
    opened.close()


def test_in_process_worker_records_hands_off_and_is_fenced(ledger: RunLedger) -> None:
    """In-process against SQLite: the whole story, with rejections raised as domain errors."""
    story(ledger, LedgerTransport(ledger))


def test_worker_over_nats_behaves_exactly_like_in_process(bus_store_url: str, nats_url: str) -> None:
    """Over NATS request-reply to a real bus service on PostgreSQL: the same story, the same errors."""
    with contextlib.ExitStack() as cleanup:  # whatever started is stopped, also when a later start fails
        loop = BackgroundLoop()
        cleanup.callback(loop.close)
        service_ledger = open_ledger(bus_store_url)
        cleanup.callback(service_ledger.close)
        reader = open_ledger(bus_store_url)
        cleanup.callback(reader.close)
        bus = NatsBus(service_ledger, nats_url)
        loop.run(bus.__aenter__())
        cleanup.callback(lambda: loop.run(bus.__aexit__(None, None, None)))
        transport = NatsTransport(nats_url)
        cleanup.callback(transport.close)
        story(reader, transport)
