"""The semantic boundaries a run moves through, and which moves are legal.

Forward moves follow the pipeline one step at a time. A candidate may be sent back for rework
(to GENERATING) before authority is granted; once COMMITTING starts there is no way back, because
an external commit cannot be silently undone.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["REWORKABLE", "Stage", "is_legal"]


class Stage(StrEnum):
    GENERATING = "GENERATING"
    CANDIDATE_READY = "CANDIDATE_READY"
    VERIFYING = "VERIFYING"
    VERIFIED = "VERIFIED"
    AWAITING_AUTHORITY = "AWAITING_AUTHORITY"
    AUTHORIZED = "AUTHORIZED"
    COMMITTING = "COMMITTING"
    COMMITTED = "COMMITTED"
    POSTCONDITION_VERIFIED = "POSTCONDITION_VERIFIED"


_ORDER = list(Stage)

REWORKABLE = frozenset({Stage.CANDIDATE_READY, Stage.VERIFYING, Stage.VERIFIED, Stage.AWAITING_AUTHORITY})


def is_legal(current: Stage, target: Stage) -> bool:
    """True when ``current -> target`` is one of the moves the module docstring allows."""
    if target is Stage.GENERATING:
        return current in REWORKABLE
    return _ORDER.index(target) == _ORDER.index(current) + 1
