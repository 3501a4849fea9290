"""A LangGraph graph that starts on worker A, stops, and resumes on worker B through Baton.

    python docs/examples/langgraph_handover.py [STORE_URL]   # default sqlite:///langgraph-demo.db

No LLM: ``work`` is a deterministic node that adds one item per step. Worker A runs three steps
and stalls without releasing the thread (a hung process); once its one-second lease has expired,
worker B takes the thread at the next epoch, reads it from Baton and finishes the graph; then A
wakes up and tries to carry on: refused with ``stale_epoch``, nothing stored. Then inspect:
``baton history demo-thread --store URL`` and ``baton audit demo-thread --store URL``.
"""

from __future__ import annotations

import operator
import sys
import time
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph

from baton.adapters.bootstrap import init_store
from baton.adapters.langgraph import BatonSaver
from baton.domain.errors import StaleEpoch

THREAD = "demo-thread"
STEPS = 6


class State(TypedDict):
    done: Annotated[list[str], operator.add]


def work(state: State) -> State:
    return {"done": [f"item-{len(state['done']) + 1}"]}


def route(state: State) -> str:
    return END if len(state["done"]) >= STEPS else "work"


def build(saver: BatonSaver):  # type: ignore[no-untyped-def]
    graph = StateGraph(State)
    graph.add_node("work", work)
    graph.add_edge(START, "work")
    graph.add_conditional_edges("work", route)
    return graph.compile(checkpointer=saver)


def main(url: str) -> None:
    init_store(url)
    config = {"configurable": {"thread_id": THREAD}}

    a = BatonSaver.from_url(url, worker="worker-a", ttl_ms=1_000)
    for n, _ in enumerate(build(a).stream({"done": []}, config, durability="sync"), 1):
        if n == 3:
            break  # worker A stalls after three steps, still holding the lease
    print("A stalled at:", a.get_tuple(config).checkpoint["channel_values"]["done"])
    time.sleep(1.2)  # the lease expires on the store's clock

    b = BatonSaver.from_url(url, worker="worker-b")
    result = build(b).invoke(None, config, durability="sync")  # resume from the last checkpoint
    print("B finished:", result["done"])
    b.close()  # a clean stop releases the lease

    try:
        build(a).invoke({"done": ["late"]}, config, durability="sync")  # A wakes up, believing it holds epoch 1
    except StaleEpoch as exc:
        print(f"A refused: {exc.reason} (current epoch {exc.current_epoch})")
    finally:
        a.close(release=False)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "sqlite:///langgraph-demo.db")
