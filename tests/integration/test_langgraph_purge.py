"""``baton purge``: a thread's payloads are erased, its events stay, shared blobs survive."""

from __future__ import annotations

from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_config, generate_metadata

from baton.adapters.bootstrap import init_store, open_ledger
from baton.adapters.cli import main
from baton.adapters.eventstore.blobs import BlobStore, SqlConnection
from baton.adapters.langgraph import BatonSaver
from baton.domain.events import CheckpointRecorded, ThreadDeleted, ThreadPurged


def test_purge_erases_blobs_keeps_events_and_spares_shared_blobs(store_url: str) -> None:
    """Given a thread and a copy of it, when the original is purged, then its reads are empty, its log
    verifies with a tombstone and an audit record, and the blobs the copy still shows survive."""
    init_store(store_url)
    with BatonSaver.from_url(store_url, worker="w") as saver:
        config = generate_config("doomed")
        checkpoint = generate_checkpoint(channel_values={"secret": "pii-1"}, channel_versions={"secret": 1})
        stored = saver.put(config, checkpoint, generate_metadata(), {"secret": 1})
        saver.put_writes(stored, [("notes", "pii-2")], "task-1")
        saver.copy_thread("doomed", "kept")
        saver.put(
            generate_config("doomed"),
            # a value too long to live inside the document: a blob of its own, erased with the document
            generate_checkpoint(channel_values={"only": "here " * 20}, channel_versions={"only": 1}),
            generate_metadata(step=1),
            {"only": 1},
        )

    assert main(["purge", "doomed", "--reason", "erasure request 7", "--store", store_url]) == 0

    with BatonSaver.from_url(store_url, worker="w2") as saver:
        assert saver.get_tuple(generate_config("doomed")) is None
        copied = saver.get_tuple(generate_config("kept"))
        assert copied is not None
        assert copied.checkpoint["channel_values"] == {"secret": "pii-1"}  # shared with the copy: kept
        assert [w[2] for w in copied.pending_writes or []] == ["pii-2"]
    ledger = open_ledger(store_url)
    try:
        events = list(ledger.history("doomed"))
        ledger.verify("doomed")
    finally:
        ledger.close()
    tombstone, record = events[-2].body, events[-1].body
    assert isinstance(tombstone, ThreadDeleted) and isinstance(record, ThreadPurged)
    assert (record.upto, record.reason, record.blobs) == (events[-2].position, "erasure request 7", 2)
    conn = SqlConnection(store_url, pool_size=1)
    try:
        documents = [e.body.document.digest for e in events if isinstance(e.body, CheckpointRecorded)]
        assert list(BlobStore(conn).get(documents)) == documents[:1]  # the second is erased, the first shared
    finally:
        conn.close()
