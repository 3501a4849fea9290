"""Baton's pure domain: events, commands, run state, decisions, budgets and the hash chain.

Imports only the standard library and msgspec, so every rule here is testable without I/O.
"""

from baton.domain.budgets import Ceilings, Usage
from baton.domain.chain import ChainReport, seal, verify_chain
from baton.domain.commands import Command, Submission, Verdict
from baton.domain.decide import context_digest, decide
from baton.domain.events import Event, RecordedEvent
from baton.domain.stages import Stage
from baton.domain.state import RunState, apply, evolve, fold

__all__ = [
    "Ceilings",
    "ChainReport",
    "Command",
    "Event",
    "RecordedEvent",
    "RunState",
    "Stage",
    "Submission",
    "Usage",
    "Verdict",
    "apply",
    "context_digest",
    "decide",
    "evolve",
    "fold",
    "seal",
    "verify_chain",
]
