"""Thread maintenance: copying a thread, pruning it, hiding what given LangGraph runs wrote.

Each is an append of commands (the log keeps everything; hiding events delete index rows), then a
catch-up of the index from the log, since these events are folded from the log, not by the writer.
"""

from __future__ import annotations

from collections.abc import Sequence

from baton.adapters.eventstore.blobs import blob_digest
from baton.adapters.langgraph.appends import ThreadWriter
from baton.domain.commands import Command, HideCheckpoints, PruneThread, PutCheckpoint, PutWrites
from baton.domain.events import BlobRef, ChannelWrite

__all__ = ["MAX_ITEMS", "copy_thread", "hide_runs", "prune"]

MAX_ITEMS = 256  # the domain's bound on list lengths
_BATCH = 500  # commands per append when copying a thread


def copy_thread(writer: ThreadWriter, source: str, target: str) -> None:
    """Append the source's visible checkpoints and writes to the target; blobs are shared, not copied."""
    index = writer.index
    writer.flush(source)
    head, indexed = index.heads(source)
    if head is None:
        return
    if indexed != head:
        writer.sync(source)
    commands: list[Command] = [
        PutCheckpoint(
            r.checkpoint_ns, r.checkpoint_id, BlobRef(blob_digest(r.document), len(r.document)), r.parent_id, r.run_tag
        )
        for r in index.checkpoints(source, oldest_first=True)
    ]
    grouped: dict[tuple[str, str, str, str], list[ChannelWrite]] = {}
    for ns, checkpoint_id, task_id, idx, channel, kind, digest, task_path in index.writes_of(source):
        grouped.setdefault((ns, checkpoint_id, task_id, task_path), []).append(
            ChannelWrite(channel, idx, kind, BlobRef(digest, 0))
        )
    for (ns, checkpoint_id, task_id, task_path), items in grouped.items():
        for i in range(0, len(items), MAX_ITEMS):
            commands.append(PutWrites(ns, checkpoint_id, task_id, tuple(items[i : i + MAX_ITEMS]), task_path))
    with writer.ordered(target):
        for i in range(0, len(commands), _BATCH):
            writer.append(target, commands[i : i + _BATCH])
        writer.sync(target)


def prune(writer: ThreadWriter, thread_ids: Sequence[str], strategy: str) -> None:
    """Hide all but the latest checkpoint per namespace (``keep_latest``) or all of them (``delete``)."""
    if strategy not in ("keep_latest", "delete"):
        raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
    for thread_id in map(str, thread_ids):
        if writer.index.heads(thread_id)[0] is None:
            continue
        with writer.ordered(thread_id):
            writer.append(thread_id, [PruneThread("delete" if strategy == "delete" else "keep_latest")])
            writer.sync(thread_id)


def hide_runs(writer: ThreadWriter, run_ids: Sequence[str]) -> None:
    """Hide the checkpoints (and their writes) that these LangGraph runs produced, in every thread."""
    tags = sorted({str(r) for r in run_ids})
    if not tags:
        return
    writer.flush()
    chunks = [tuple(tags[i : i + MAX_ITEMS]) for i in range(0, len(tags), MAX_ITEMS)]
    for thread_id in writer.index.runs_tagged(tags):
        with writer.ordered(thread_id):
            writer.append(thread_id, [HideCheckpoints(chunk) for chunk in chunks])
            writer.sync(thread_id)
