"""A real LangGraph graph run in several threads at once: the thread index keeps up with each log.

LangGraph writes one thread from several places at once (a sync graph puts checkpoints from its
thread pool while its tasks put their writes; an async graph from concurrent tasks). Each append
carries the previous append's index fold, so folds recorded out of order would leave the index
behind until a reader catches it up from the log.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypedDict

import pytest
from integration_support import RawStore
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata
from langgraph.graph import END, START, StateGraph

from baton.adapters.bootstrap import init_store
from baton.adapters.langgraph import BatonSaver

STEPS = 500  # supersteps per thread
THREADS = 3  # run at once: 1,500 supersteps in all


class Counter(TypedDict):
    n: int


def _graph(saver: BatonSaver) -> Any:
    """One node that adds 1 to ``n``, looping until ``n`` reaches ``STEPS``: one superstep each."""
    graph = StateGraph(Counter)
    graph.add_node("step", lambda state: {"n": state["n"] + 1})
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", lambda state: "step" if state["n"] < STEPS else END)
    return graph.compile(checkpointer=saver)


def _config(thread: str) -> Any:
    return {"configurable": {"thread_id": thread}, "recursion_limit": STEPS + 10}


def _put(saver: BatonSaver, thread: str, step: int) -> Any:
    checkpoint = generate_checkpoint(channel_values={"step": step}, channel_versions={"step": step + 1})
    return saver.put(generate_config(thread), checkpoint, generate_metadata(step=step), {"step": step + 1})


def _assert_index_kept_up(saver: BatonSaver, graph: Any, threads: list[str]) -> None:
    """Each thread's index is one event behind its log's head (the last put's fold waits for the next
    append or read), no fold missed, and a read lands the last fold without a catch-up from the log."""
    for thread in threads:
        head, indexed = saver.index.heads(thread)
        assert head is not None and head > 2 * STEPS, (thread, head)
        assert indexed == head - 1, (thread, head, indexed)
    assert (saver.index.cas_misses, saver.index.catch_ups) == (0, 0)
    for thread in threads:
        assert graph.get_state(_config(thread)).values == {"n": STEPS}
        head, _ = saver.index.heads(thread)
        assert saver.index.heads(thread) == (head, head)
    assert (saver.index.cas_misses, saver.index.catch_ups) == (0, 0)


def test_a_sync_graph_in_several_threads_keeps_the_index_at_the_head(store_url: str) -> None:
    """Given a sync graph, when it runs its supersteps in several threads at once (``invoke`` and
    ``stream``), then every thread's index ends one event behind the head and a read needs no catch-up."""
    init_store(store_url)
    threads = [f"sync-{i}" for i in range(THREADS)]
    with BatonSaver.from_url(store_url, worker="w") as saver:
        graph = _graph(saver)

        def run(thread: str, stream: bool) -> None:
            if stream:
                for _ in graph.stream({"n": 0}, _config(thread)):
                    pass
            else:
                graph.invoke({"n": 0}, _config(thread))

        with ThreadPoolExecutor(THREADS) as pool:
            for done in [pool.submit(run, t, i == 0) for i, t in enumerate(threads)]:
                done.result()
        _assert_index_kept_up(saver, graph, threads)


def test_an_async_graph_in_concurrent_tasks_keeps_the_index_at_the_head(store_url: str) -> None:
    """Given a graph run with ``ainvoke``, when several threads run as concurrent tasks of one event loop,
    then every thread's index ends one event behind the head and a read needs no catch-up."""
    init_store(store_url)
    threads = [f"async-{i}" for i in range(THREADS)]
    with BatonSaver.from_url(store_url, worker="w") as saver:
        graph = _graph(saver)

        async def run_all() -> None:
            await asyncio.gather(*(graph.ainvoke({"n": 0}, _config(t)) for t in threads))

        asyncio.run(run_all())
        _assert_index_kept_up(saver, graph, threads)


def test_a_restarted_worker_catches_the_index_up_when_it_takes_its_thread_back(store_url: str) -> None:
    """Given a saver that stopped without folding its last put (a crash), when a new saver of the same worker
    puts on the thread, then it folds the log once as it takes the lease back and its own folds land again."""
    init_store(store_url)
    crashed = BatonSaver.from_url(store_url, worker="w")
    for step in range(3):
        _put(crashed, "resumed", step)
    crashed.ledger.close()  # no close(): its last fold is lost with it
    crashed.conn.close()
    with BatonSaver.from_url(store_url, worker="w") as saver:
        for step in range(3, 6):
            _put(saver, "resumed", step)
        head, indexed = saver.index.heads("resumed")
        assert head is not None and indexed == head - 1
        assert (saver.index.cas_misses, saver.index.catch_ups) == (0, 1)


def test_a_fold_that_a_reader_made_already_misses_quietly(store_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Given a writer whose last put a reader in another process has folded (its catch-up), when the writer
    reads and puts on, then its fold misses, is counted but not warned about, and its next folds land."""
    init_store(store_url)
    with BatonSaver.from_url(store_url, worker="w") as writer, BatonSaver.from_url(store_url, worker="r") as reader:
        for step in range(3):
            _put(writer, "shared", step)
        assert reader.get_tuple(generate_config("shared")) is not None
        caplog.set_level(logging.DEBUG, logger="baton.langgraph")
        assert writer.get_tuple(generate_config("shared")) is not None
        _put(writer, "shared", 3)
        _put(writer, "shared", 4)
        head, indexed = writer.index.heads("shared")
        assert head is not None and indexed == head - 1
        assert (writer.index.cas_misses, writer.index.catch_ups) == (1, 0)
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_index_set_back_is_logged_and_folded_from_the_log(store: RawStore, caplog: pytest.LogCaptureFixture) -> None:
    """Given a writer's thread whose index was set back behind the writer's pending fold (rebuilt by an
    operator, or a fold lost), when the writer reads, then the miss is warned about and counted, and the
    read answers from an index caught up from the log."""
    with BatonSaver.from_url(store.url, worker="w") as saver:
        for step in range(3):
            _put(saver, "set-back", step)
        store.execute("DELETE FROM baton_lg_threads", "DELETE FROM baton_lg_checkpoints")
        found = saver.get_tuple(generate_config("set-back"))
        assert found is not None and found.checkpoint["channel_values"] == {"step": 2}
        head, _ = saver.index.heads("set-back")
        assert saver.index.heads("set-back") == (head, head)
        assert (saver.index.cas_misses, saver.index.catch_ups) == (1, 1)
        assert [r.name for r in caplog.records if r.levelno == logging.WARNING] == ["baton.langgraph"]
