"""LangGraph's own checkpointer conformance suite against ``BatonSaver``, on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from langgraph.checkpoint.conformance import checkpointer_test, validate

from baton.adapters.bootstrap import init_store
from baton.adapters.langgraph import BatonSaver


def test_baton_saver_passes_langgraph_conformance(store_url: str) -> None:
    """Given a fresh store, when the conformance suite runs, then every base and optional capability passes."""
    init_store(store_url)

    async def factory() -> AsyncGenerator[BatonSaver, None]:
        saver = BatonSaver.from_url(store_url, worker="conformance")
        try:
            yield saver
        finally:
            saver.close()

    report = asyncio.run(validate(checkpointer_test(name="BatonSaver")(factory)))

    counts = {name: (r.tests_passed, r.tests_failed) for name, r in sorted(report.results.items())}
    print(f"conformance {store_url.partition(':')[0]}: {counts}")  # passed, failed per capability
    failures = [f for r in report.results.values() for f in r.failures]
    assert report.passed_all_base(), failures
    assert report.passed_all(), failures
    assert all(r.detected for r in report.results.values())
