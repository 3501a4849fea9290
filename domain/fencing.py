"""What the store must check and change in the same transaction as an append.

The decision is made against a state read *before* the transaction; the fence re-checks, under the
run row's lock, that nothing moved since: the head (so positions stay contiguous), the epoch and
the holder (so a stale owner never slips in), then installs the run row of the new state.
"""

from __future__ import annotations

import msgspec

from baton.domain.state import RunState

__all__ = ["Fence", "fence_for"]


class Fence(msgspec.Struct, frozen=True):
    run_id: str
    expected_head: int
    expected_head_digest: str
    expected_epoch: int
    expected_holder: str | None
    new_head: int
    new_head_digest: str
    new_epoch: int
    new_holder: str | None
    new_expires_at: int | None
    stage: str
    status: str


def fence_for(before: RunState, after: RunState) -> Fence:
    """The compare-and-set that turns ``before`` into ``after`` in the store's run row."""
    return Fence(
        run_id=after.run_id,
        expected_head=before.version,
        expected_head_digest=before.head_digest,
        expected_epoch=before.epoch,
        expected_holder=before.holder,
        new_head=after.version,
        new_head_digest=after.head_digest,
        new_epoch=after.epoch,
        new_holder=after.holder,
        new_expires_at=after.lease.expires_at if after.lease else None,
        stage=str(after.stage),
        status=after.status,
    )
