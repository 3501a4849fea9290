"""Pure folds over recorded events: portable state, budgets, replay prefix, resumability, audit, report.

Each projection is an incremental fold (``apply`` one event at a time) plus a convenience
function over an iterable; folding in any chunking gives the same result.
"""

from baton.projections.audit import CODES, AuditFold, Problem
from baton.projections.budget_usage import DIMENSIONS, BudgetUsageFold, budget_usage
from baton.projections.explain import Explanation, explain
from baton.projections.portable_state import PortableState, PortableStateFold, portable_state
from baton.projections.replay import ReplayCursor, ReplayDivergence, ReplayFold, ReplayPrefix, replay_prefix
from baton.projections.report import ReportFold, RunReport, build_report
from baton.projections.resumability import Resumability, ResumabilityClass, classify, summarize

__all__ = [
    "CODES",
    "DIMENSIONS",
    "AuditFold",
    "BudgetUsageFold",
    "Explanation",
    "PortableState",
    "PortableStateFold",
    "Problem",
    "ReplayCursor",
    "ReplayDivergence",
    "ReplayFold",
    "ReplayPrefix",
    "ReportFold",
    "Resumability",
    "ResumabilityClass",
    "RunReport",
    "budget_usage",
    "build_report",
    "classify",
    "explain",
    "portable_state",
    "replay_prefix",
    "summarize",
]
