"""Materialised views for analysts: ``run_state`` and ``budget_usage``, maintained exactly once.

The runner polls the event log (a parameter: any ``EventSource``) and applies it in batches; each
batch writes view rows, per-run fold states and its tracking row in one transaction. See
docs/analytics.md.
"""

from baton.adapters.views.postgres_views import PostgresViews
from baton.adapters.views.progress import ProgressLine
from baton.adapters.views.runner import DEFAULT_BATCH, CatchUp, EventSource, ViewRunner
from baton.adapters.views.sqlite_views import SQLiteViews
from baton.adapters.views.tables import ViewStore, ViewTables

__all__ = [
    "DEFAULT_BATCH",
    "CatchUp",
    "EventSource",
    "PostgresViews",
    "ProgressLine",
    "SQLiteViews",
    "ViewRunner",
    "ViewStore",
    "ViewTables",
]
