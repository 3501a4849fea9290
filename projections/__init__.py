"""Pure folds over recorded events: portable state, budgets, replay prefix, resumability.

Each projection is an incremental fold (``apply`` one event at a time) plus a convenience
function over an iterable; folding in any chunking gives the same result.
"""

from projections.budget_usage import DIMENSIONS, BudgetUsageFold, budget_usage
from projections.portable_state import PortableState, PortableStateFold, portable_state
from projections.replay import ReplayCursor, ReplayDivergence, ReplayFold, ReplayPrefix, replay_prefix
from projections.resumability import Resumability, ResumabilityClass, classify, summarize

__all__ = [
    "DIMENSIONS",
    "BudgetUsageFold",
    "PortableState",
    "PortableStateFold",
    "ReplayCursor",
    "ReplayDivergence",
    "ReplayFold",
    "ReplayPrefix",
    "Resumability",
    "ResumabilityClass",
    "budget_usage",
    "classify",
    "portable_state",
    "replay_prefix",
    "summarize",
]
