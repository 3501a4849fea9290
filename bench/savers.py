"""The table the two saver benchmarks print: BatonSaver against a LangGraph saver, median over rounds."""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["baton_against_postgres"]


def baton_against_postgres(results: dict[str, list[dict[str, float]]], rows: list[tuple[str, str]]) -> dict[str, Any]:
    """Print one row per ``(measure, unit)`` (seconds in ``results``, shown in ms) and return them as a summary."""
    summary = {}
    for key, unit in rows:
        b = statistics.median(r[key] for r in results["baton"]) * 1e3
        p = statistics.median(r[key] for r in results["postgres"]) * 1e3
        summary[key] = {"baton_ms": b, "postgres_ms": p, "ratio": b / p}
        print(f"| {key} | {b:.3f} {unit} | {p:.3f} {unit} | {b / p:.2f} |")
    return summary
