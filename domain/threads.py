"""Decisions for LangGraph threads kept as Baton runs (docs/langgraph.md).

A thread's checkpoints and pending writes are events whose payloads live in the blob store; the
events carry digests. Hiding (tombstones, ``delete_for_runs``, pruning) is itself an event: reads
stop showing what it hides, the log keeps everything. Purging is the one way data leaves the store:
the blobs go, a tombstone and an audit record of what went stay.
"""

from __future__ import annotations

from baton.domain import errors
from baton.domain.commands import DeleteThread, HideCheckpoints, PruneThread, PurgeThread, PutCheckpoint, PutWrites
from baton.domain.events import (
    CheckpointRecorded,
    CheckpointsHidden,
    Event,
    ThreadDeleted,
    ThreadPruned,
    ThreadPurged,
    WritesRecorded,
)
from baton.domain.state import RunState

__all__ = ["PURGE_TOMBSTONE", "THREAD_COMMANDS", "decide_purge", "decide_thread"]

THREAD_COMMANDS = (PutCheckpoint, PutWrites, DeleteThread, HideCheckpoints, PruneThread)
PURGE_TOMBSTONE = "purge: "  # how a purge's tombstone (``ThreadDeleted.reason``) starts


def decide_thread(
    state: RunState, command: PutCheckpoint | PutWrites | DeleteThread | HideCheckpoints | PruneThread
) -> list[Event]:
    """The events of a fenced thread command (the caller has checked the lease)."""
    if isinstance(command, PutCheckpoint):
        if not command.checkpoint_id or command.parent_checkpoint_id == command.checkpoint_id:
            raise errors.Malformed("a checkpoint needs an id that differs from its parent's")
        return [
            CheckpointRecorded(
                command.checkpoint_ns,
                command.checkpoint_id,
                command.document,
                command.parent_checkpoint_id,
                command.run_tag,
            )
        ]
    if isinstance(command, PutWrites):
        indexes = [write.idx for write in command.writes]
        if not command.writes or len(set(indexes)) != len(indexes) or not command.checkpoint_id:
            raise errors.Malformed("writes need a checkpoint id and at least one write, each index once")
        return [
            WritesRecorded(
                command.checkpoint_ns, command.checkpoint_id, command.task_id, command.writes, command.task_path
            )
        ]
    if isinstance(command, DeleteThread):
        return [ThreadDeleted(command.reason)]
    if isinstance(command, HideCheckpoints):
        if not command.run_tags:
            raise errors.Malformed("hide_checkpoints needs at least one run id")
        return [CheckpointsHidden(command.run_tags)]
    return [ThreadPruned(command.strategy, state.version)]


def decide_purge(state: RunState, command: PurgeThread) -> list[Event]:
    """A tombstone, then the audit record of the erasure it covers; any worker (an operator) may purge."""
    if command.blobs < 0 or not command.reason:
        raise errors.Malformed("a purge needs a reason and a non-negative blob count")
    tombstone = state.version + 1
    return [
        ThreadDeleted(PURGE_TOMBSTONE + command.reason),
        ThreadPurged(tombstone, command.reason, command.blobs, command.blobs_digest),
    ]
