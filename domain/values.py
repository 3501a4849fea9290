"""The values events carry: where a worker runs, what an intent depends on, a payload's reference, a
run's policy, a principal's roles. Commands carry them too; they are facts about nothing by themselves.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = ["ROLES", "BlobRef", "ChannelWrite", "FailureReason", "IntentContext", "Placement", "Role", "RunPolicy"]

Role = Literal["worker", "approver", "verifier", "operator", "auditor"]
ROLES: tuple[Role, ...] = ("worker", "approver", "verifier", "operator", "auditor")

FailureReason = Literal[
    "timeout",
    "tool_error",
    "rejected_by_host",
    "invalid_arguments",
    "permission_denied",
    "unavailable",
    "cancelled",
]


class BlobRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A content-addressed payload kept outside the log: the event holds only this."""

    digest: str
    size: int
    uri: str = ""


class Placement(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where a lease holder runs and what it can honour."""

    worker: str
    model: str = ""
    provider: str = ""
    region: str = ""
    capabilities: tuple[str, ...] = ()
    tool_contracts: tuple[str, ...] = ()


class IntentContext(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """Everything an intent depends on; a replayed intent must reproduce it byte for byte."""

    turn: int
    operation: str
    effect: str = ""
    authorization: str = ""
    state_digest: str = ""
    proposal_digest: str = ""
    arguments: dict[str, Any] = {}


class ChannelWrite(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One pending write of a task: its channel, index, serializer type and the blob holding its value."""

    channel: str
    idx: int
    kind: str
    ref: BlobRef


class RunPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """What a run's effects need, by tool contract (``fnmatch`` patterns such as ``git@*``): an approval
    for, and passing verifier evidence of, exactly the proposal an effect commits. ``approvals``:
    ``artifact`` (an approval of P stays valid for P after a takeover) or ``epoch`` (it ends with the
    holder's epoch, as grants do)."""

    approval_required: tuple[str, ...] = ()
    evidence_required: tuple[str, ...] = ()
    approvals: Literal["artifact", "epoch"] = "artifact"
