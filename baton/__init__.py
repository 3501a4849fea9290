"""Baton: the run ledger for movable AI agents.

``import baton`` is the public face: the worker client and its transports, the composition root's
``open_ledger``, the LangGraph checkpointer, the pydantic-ai agent and the error tree. Everything
else is reachable under ``baton.domain`` (pure rules), ``baton.projections`` (pure folds) and
``baton.adapters`` (I/O), whose layout docs/architecture.md describes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from baton.adapters.agents import BatonAgent, idempotency_key
    from baton.adapters.bootstrap import init_store, open_ledger, register
    from baton.adapters.identity import SigningKey
    from baton.adapters.kafka_transport import KafkaTransport
    from baton.adapters.langgraph import BatonSaver
    from baton.adapters.transports import connect_transport
    from baton.adapters.worker import LedgerTransport, NatsTransport, Resumed, Transport, Worker
    from baton.domain import errors
    from baton.domain.budgets import Ceilings, Price, Usage
    from baton.domain.commands import Submission, Verdict
    from baton.domain.errors import BatonError, ConcurrencyConflict, Rejection, StoreUnavailable
    from baton.domain.events import IntentContext, Placement, RunPolicy
    from baton.domain.stages import Stage

# Each name is imported when first used, so ``import baton.domain`` stays free of I/O libraries
# and LangGraph and pydantic-ai (optional extras) are needed only for ``baton.BatonSaver`` and
# ``baton.BatonAgent``.
_HOME = {
    "Worker": "baton.adapters.worker",
    "Resumed": "baton.adapters.worker",
    "Transport": "baton.adapters.worker",
    "LedgerTransport": "baton.adapters.worker",
    "NatsTransport": "baton.adapters.worker",
    "KafkaTransport": "baton.adapters.kafka_transport",
    "connect_transport": "baton.adapters.transports",
    "open_ledger": "baton.adapters.bootstrap",
    "init_store": "baton.adapters.bootstrap",
    "register": "baton.adapters.bootstrap",
    "SigningKey": "baton.adapters.identity",
    "BatonSaver": "baton.adapters.langgraph",
    "BatonAgent": "baton.adapters.agents",
    "idempotency_key": "baton.adapters.agents",
    "Price": "baton.domain.budgets",
    "Ceilings": "baton.domain.budgets",
    "Usage": "baton.domain.budgets",
    "Placement": "baton.domain.events",
    "IntentContext": "baton.domain.events",
    "RunPolicy": "baton.domain.events",
    "Stage": "baton.domain.stages",
    "Submission": "baton.domain.commands",
    "Verdict": "baton.domain.commands",
    "BatonError": "baton.domain.errors",
    "Rejection": "baton.domain.errors",
    "ConcurrencyConflict": "baton.domain.errors",
    "StoreUnavailable": "baton.domain.errors",
}

__all__ = [
    "Worker",
    "Resumed",
    "Transport",
    "LedgerTransport",
    "NatsTransport",
    "KafkaTransport",
    "connect_transport",
    "open_ledger",
    "init_store",
    "register",
    "SigningKey",
    "BatonSaver",
    "BatonAgent",
    "idempotency_key",
    "Ceilings",
    "Price",
    "Usage",
    "Placement",
    "IntentContext",
    "RunPolicy",
    "Stage",
    "Submission",
    "Verdict",
    "BatonError",
    "Rejection",
    "ConcurrencyConflict",
    "StoreUnavailable",
    "errors",
]


def __getattr__(name: str) -> Any:
    if name == "errors":  # the whole tree of rejections, by reason code
        return importlib.import_module("baton.domain.errors")
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'baton' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])
