"""LangGraph threads as runs: checkpoint, write, hide and purge decisions (domain/threads.py)."""

from __future__ import annotations

from baton.domain.commands import (
    CompleteRun,
    DeleteThread,
    HideCheckpoints,
    PruneThread,
    PurgeThread,
    PutCheckpoint,
    PutWrites,
)
from baton.domain.events import (
    BlobRef,
    ChannelWrite,
    CheckpointRecorded,
    CheckpointsHidden,
    ThreadDeleted,
    ThreadPruned,
    ThreadPurged,
    WritesRecorded,
)

from .given import W1, W2, given

DOC = BlobRef("sha256:" + "d" * 64, 120)
VALUE = BlobRef("sha256:" + "e" * 64, 7)


def put(checkpoint_id: str = "c-2", parent: str | None = "c-1") -> PutCheckpoint:
    return PutCheckpoint("", checkpoint_id, DOC, parent, run_tag="lg-run-1")


def test_the_holder_records_a_checkpoint_by_its_document_digest() -> None:
    """Given W1 holds the lease, when it puts a checkpoint, then one CheckpointRecorded carries the digest only."""
    events = given().opened().leased(W1).when(put())
    assert events == [CheckpointRecorded("", "c-2", DOC, "c-1", "lg-run-1")]


def test_a_checkpoint_from_a_stale_worker_is_rejected() -> None:
    """Given W2 took the lease at epoch 2, when W1 puts at epoch 1, then stale_epoch with the current epoch."""
    history = given().opened().leased(W1, ttl_ms=1).advance(2_000).leased(W2)
    err = history.rejects(put(), worker=W1, epoch=1)
    assert (err.reason, getattr(err, "current_epoch", None)) == ("stale_epoch", 2)


def test_a_checkpoint_that_is_its_own_parent_is_malformed() -> None:
    """Given a leased thread, when a checkpoint names itself as parent, then malformed."""
    assert given().opened().leased(W1).rejects(put("c-1", "c-1")).reason == "malformed"


def test_writes_are_recorded_and_duplicate_indexes_are_malformed() -> None:
    """Given a leased thread, when a task writes, then WritesRecorded; the same index twice is malformed."""
    write = ChannelWrite("messages", 0, "msgpack", VALUE)
    history = given().opened().leased(W1)
    assert history.when(PutWrites("", "c-1", "task-1", (write,))) == [WritesRecorded("", "c-1", "task-1", (write,))]
    assert history.rejects(PutWrites("", "c-1", "task-1", (write, write))).reason == "malformed"
    assert history.rejects(PutWrites("", "c-1", "task-1", ())).reason == "malformed"


def test_hiding_commands_record_what_they_hide() -> None:
    """Given a leased thread with a checkpoint, when it is deleted, hidden by run or pruned, then the matching event."""
    history = given().opened().leased(W1)
    history.record(put())
    assert history.when(DeleteThread("gone")) == [ThreadDeleted("gone")]
    assert history.when(HideCheckpoints(("lg-run-1",))) == [CheckpointsHidden(("lg-run-1",))]
    assert history.when(PruneThread("keep_latest")) == [ThreadPruned("keep_latest", history.state.version)]
    assert history.rejects(HideCheckpoints(())).reason == "malformed"


def test_an_operator_purges_a_thread_it_does_not_hold_even_when_closed() -> None:
    """Given W1 holds a completed thread, when an operator purges it, then a tombstone and the audit record."""
    history = given().opened().leased(W1)
    history.record(put())
    history.record(CompleteRun())
    events = history.when(PurgeThread("gdpr request 7", 3, "sha256:" + "f" * 64), worker="operator:alice", epoch=0)
    tombstone = history.state.version + 1
    assert events == [
        ThreadDeleted("purge: gdpr request 7"),
        ThreadPurged(tombstone, "gdpr request 7", 3, "sha256:" + "f" * 64),
    ]
    assert history.rejects(PurgeThread("", 0, ""), worker="operator:alice", epoch=0).reason == "malformed"
