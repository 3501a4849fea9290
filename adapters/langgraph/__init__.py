"""LangGraph checkpointer backed by Baton (``pip install 'baton-ledger[langgraph]'``; docs/langgraph.md).

``BatonSaver`` is imported lazily: ``baton store init`` and ``baton purge`` use the thread index
(``adapters.langgraph.index``) without the optional LangGraph packages installed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BatonSaver"]


def __getattr__(name: str) -> Any:
    if name == "BatonSaver":
        from baton.adapters.langgraph.saver import BatonSaver  # noqa: PLC0415 - LangGraph is an optional extra

        return BatonSaver
    raise AttributeError(name)
