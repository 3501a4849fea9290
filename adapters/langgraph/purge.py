"""``baton purge RUN_ID``: erase a LangGraph thread's payloads, keeping a tombstone and an audit record.

Events are never deleted; blobs may be. A purge appends ``ThreadDeleted`` (the thread reads as
empty from then on) and ``ThreadPurged`` (how many blobs, and a digest over their sorted digests)
in one append, then deletes those blobs. Content addressing means a blob may be shared: a blob that
a visible checkpoint or write of another thread still references is kept (and not counted). No
LangGraph import: the CLI works without the optional extra.
"""

from __future__ import annotations

import getpass
import hashlib
import uuid
from collections.abc import Sequence

import msgspec

from baton.adapters.eventstore import RunLedger
from baton.adapters.eventstore.blobs import BlobStore, SqlConnection
from baton.adapters.langgraph.document import referenced_digests
from baton.adapters.langgraph.index import ThreadIndex
from baton.domain import errors
from baton.domain.commands import PurgeThread, Submission
from baton.domain.events import CheckpointRecorded, WritesRecorded

__all__ = ["PurgeReport", "purge_thread"]

_CHUNK = 500
_ATTEMPTS = 8


class PurgeReport(msgspec.Struct, frozen=True):
    run_id: str
    position: int  # the audit record (ThreadPurged); the tombstone is the position before it
    erased: int  # blobs the record lists (deleted now, or by an earlier purge)
    deleted: int  # rows deleted by this purge
    kept_shared: int  # blobs still referenced by another thread's visible checkpoints or writes
    blobs_digest: str


def purge_thread(
    ledger: RunLedger, conn: SqlConnection, run_id: str, *, reason: str, operator: str | None = None
) -> PurgeReport:
    """Append the tombstone and the audit record, then delete the thread's blobs (idempotent: run it again)."""
    blobs = BlobStore(conn)
    index = ThreadIndex(conn, blobs)
    if not ledger.state(run_id).opened:
        raise errors.RunNotFound(f"run {run_id!r} does not exist")
    candidates: set[str] = set()
    documents: list[str] = []
    for event in ledger.history(run_id):
        if isinstance(event.body, CheckpointRecorded):
            documents.append(event.body.document.digest)
        elif isinstance(event.body, WritesRecorded):
            candidates.update(write.ref.digest for write in event.body.writes)
    candidates.update(documents)
    for chunk in _chunks(documents):
        for data in blobs.get(chunk).values():
            candidates.update(referenced_digests(data))
    shared = candidates & index.digests_in_use(except_run=run_id)
    erase = sorted(candidates - shared)
    digest = "sha256:" + hashlib.sha256("\n".join(erase).encode()).hexdigest()
    worker = operator or f"operator:{getpass.getuser()}"
    command = PurgeThread(reason, len(erase), digest)
    for _ in range(_ATTEMPTS):  # an unfenced append loses a race to the holder as "stale": decide again
        verdict = ledger.submit(Submission("purge-" + uuid.uuid4().hex, run_id, worker, command))
        if verdict.verdict != "rejected" or verdict.reason not in ("stale_epoch", "concurrency_conflict"):
            break
    if verdict.verdict == "rejected":
        raise errors.Rejection(f"purge of {run_id!r} rejected: {verdict.reason}: {verdict.message}")
    deleted = sum(blobs.delete(chunk) for chunk in _chunks(erase))
    index.catch_up(run_id, lambda after: ledger.history(run_id, after=after))
    return PurgeReport(run_id, verdict.position or 0, len(erase), deleted, len(shared), digest)


def _chunks(items: Sequence[str]) -> list[Sequence[str]]:
    return [items[i : i + _CHUNK] for i in range(0, len(items), _CHUNK)]
