"""``BatonSaver``: LangGraph's ``BaseCheckpointSaver`` on a Baton ledger (docs/langgraph.md).

Each thread is a Baton run (run id = thread id); each checkpoint and each batch of pending writes is
an event in that run's hash-chained log, appended under the thread's lease. Channel values,
checkpoints and writes are blobs by digest; reads go to the thread index, never to a log scan.
This module serializes and reads; ``appends.ThreadWriter`` appends, holds the leases and folds the
index; ``maintenance`` copies, prunes and hides.

Fencing: the saver takes the thread's lease on first use (opening the run if needed) and renews
it when less than half its ttl is left. Once it has held a thread, it never silently takes it
back: if another worker moved the epoch on, every write raises ``StaleEpoch``.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import os
import socket
import threading
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, NamedTuple

import msgspec
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from baton.adapters.bootstrap import open_ledger
from baton.adapters.clock import Clock
from baton.adapters.eventstore import RunLedger
from baton.adapters.eventstore.blobs import BlobStore, SqlConnection, blob_digest
from baton.adapters.identity import SigningKey
from baton.adapters.langgraph import maintenance
from baton.adapters.langgraph.appends import ThreadWriter
from baton.adapters.langgraph.document import Document, decode_document
from baton.adapters.langgraph.index import CheckpointRow, ThreadIndex, WriteRow
from baton.adapters.langgraph.maintenance import MAX_ITEMS
from baton.domain.commands import Command, DeleteThread, PutCheckpoint, PutWrites
from baton.domain.events import BlobRef, ChannelWrite

__all__ = ["BatonSaver"]

log = logging.getLogger("baton.langgraph")

_CACHE = 65_536
_INLINE = 64  # serialized values up to this size live in the document (a digest there takes 71 bytes)
_doc_encoder = msgspec.msgpack.Encoder()


class _Put(NamedTuple):
    """A checkpoint ready to append: its command and the blobs it references (its document's among them)."""

    thread_id: str
    command: PutCheckpoint
    blobs: dict[str, bytes]


class BatonSaver(BaseCheckpointSaver[int]):
    """A LangGraph checkpointer whose threads are fenced, hash-chained Baton runs."""

    def __init__(
        self,
        ledger: RunLedger,
        conn: SqlConnection,
        *,
        worker: str | None = None,
        ttl_ms: int = 300_000,
        serde: SerializerProtocol | None = None,
        owns: bool = False,
        key: SigningKey | None = None,
    ) -> None:
        """``key``: the private key of the principal ``worker`` names, in a store that verifies
        identities (every submission of this saver is signed with it)."""
        super().__init__(serde=serde)
        self.ledger = ledger
        self.key = key
        self.conn = conn
        self.blobs = BlobStore(conn)
        self.index = ThreadIndex(conn, self.blobs)
        self.worker = worker or f"langgraph-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.ttl_ms = ttl_ms
        self._owns = owns
        self._writer = ThreadWriter(ledger, self.index, worker=self.worker, ttl_ms=ttl_ms, key=key)
        # (thread, ns, channel, version) -> (kind, digest) of a blob, or (kind, bytes) of an inline value
        self._values: OrderedDict[tuple[str, str, str, Any], tuple[str, str | bytes]] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_url(
        cls,
        url: str | None = None,
        *,
        worker: str | None = None,
        ttl_ms: int = 300_000,
        serde: SerializerProtocol | None = None,
        clock: Clock | None = None,
        key: SigningKey | None = None,
    ) -> BatonSaver:
        """A saver on an initialised store (``baton store init``); ``close()`` releases its leases."""
        ledger = open_ledger(url, clock=clock)
        try:
            conn = SqlConnection(url or _store_url())
        except BaseException:
            ledger.close()
            raise
        return cls(ledger, conn, worker=worker, ttl_ms=ttl_ms, serde=serde, owns=True, key=key)

    def __enter__(self) -> BatonSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, *, release: bool = True) -> None:
        """Release the leases this saver holds (so another worker may resume at once), fold its threads'
        index to their heads, then disconnect."""
        if release:
            self._writer.release_all()
        self._writer.flush()
        if self._owns:
            self.ledger.close()
            self.conn.close()

    def release(self, thread_id: str) -> None:
        """Give the thread's lease back; a later write by this saver takes it again if nobody else has."""
        self._writer.release(str(thread_id))

    def forget(self, thread_id: str) -> None:
        """Let this saver take a thread it lost again (after the application has re-read the thread)."""
        self._writer.forget(str(thread_id))

    # -- LangGraph's API (sync) ---------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        conf = config["configurable"]
        thread_id, ns, checkpoint_id = str(conf["thread_id"]), conf.get("checkpoint_ns", ""), conf.get("checkpoint_id")
        self._writer.flush(thread_id)
        head, indexed, row = self.index.lookup(thread_id, ns, checkpoint_id)
        if head is None:
            return None
        if indexed != head:
            self._catch_up(thread_id, head, indexed)
            _, _, row = self.index.lookup(thread_id, ns, checkpoint_id)
        return self._tuples([row])[0] if row is not None else None

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        conf = config["configurable"] if config else {}
        thread_id = str(conf["thread_id"]) if conf.get("thread_id") is not None else None
        self._writer.flush(thread_id)
        if thread_id is not None:
            head, indexed = self.index.heads(thread_id)
            if head is None:
                return
            if indexed != head:
                self._catch_up(thread_id, head, indexed)
        rows = self.index.checkpoints(
            thread_id,
            ns=conf.get("checkpoint_ns"),
            checkpoint_id=conf.get("checkpoint_id"),
            before=before["configurable"]["checkpoint_id"] if before else None,
            metadata=filter,
            limit=limit,
        )
        yield from self._tuples(rows)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        put = self._checkpoint_put(config, checkpoint, metadata, new_versions)
        self._writer.append(put.thread_id, [put.command], put.blobs, fold=True)
        return _stored(put)

    def _checkpoint_put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> _Put:
        """The command and blobs of a checkpoint (serialization only, no I/O)."""
        conf = config["configurable"]
        thread_id, ns, parent = str(conf["thread_id"]), conf.get("checkpoint_ns", ""), conf.get("checkpoint_id")
        values = checkpoint["channel_values"]
        blobs: dict[str, bytes] = {}
        channels: dict[str, tuple[str, str]] = {}
        inline: dict[str, tuple[str, bytes]] = {}
        for channel, version in checkpoint["channel_versions"].items():
            if channel not in values:
                continue
            key = (thread_id, ns, channel, version)
            ref = None if channel in new_versions else self._cached(key)
            if ref is None:
                kind, data = self.serde.dumps_typed(values[channel])
                if len(data) > _INLINE:
                    ref = (kind, blob_digest(data))
                    blobs[ref[1]] = data
                else:
                    ref = (kind, data)
                self._cache(key, ref)
            kind, held = ref
            if isinstance(held, str):
                channels[channel] = (kind, held)  # a blob's digest
            else:
                inline[channel] = (kind, held)
        skeleton = {**checkpoint, "channel_values": {}}
        full = get_checkpoint_metadata(config, metadata)
        document = Document(
            self.serde.dumps_typed(skeleton),
            self.serde.dumps_typed(full),
            msgspec.json.encode(full, enc_hook=str),
            channels,
            inline,
        )
        data = _doc_encoder.encode(document)
        doc_ref = BlobRef(blob_digest(data), len(data))
        blobs[doc_ref.digest] = data
        run_tag = str(full.get("run_id") or "")[:200]
        return _Put(thread_id, PutCheckpoint(ns, checkpoint["id"], doc_ref, parent, run_tag), blobs)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        if writes:
            thread_id, commands, blobs = self._writes_put(config, writes, task_id, task_path)
            self._writer.append(thread_id, commands, blobs, fold=True)

    def _writes_put(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
    ) -> tuple[str, builtins.list[Command], dict[str, bytes]]:
        """The commands and blobs of a task's writes (serialization only, no I/O)."""
        conf = config["configurable"]
        thread_id, ns, checkpoint_id = str(conf["thread_id"]), conf.get("checkpoint_ns", ""), conf["checkpoint_id"]
        blobs: dict[str, bytes] = {}
        by_idx: dict[int, ChannelWrite] = {}
        for idx, (channel, value) in enumerate(writes):
            kind, data = self.serde.dumps_typed(value)
            digest = blob_digest(data)
            blobs[digest] = data
            slot = WRITES_IDX_MAP.get(channel, idx)
            by_idx[slot] = ChannelWrite(channel, slot, kind, BlobRef(digest, len(data)))
        items = list(by_idx.values())
        commands: builtins.list[Command] = [
            PutWrites(ns, checkpoint_id, task_id, tuple(items[i : i + MAX_ITEMS]), task_path)
            for i in range(0, len(items), MAX_ITEMS)
        ]
        return thread_id, commands, blobs

    def delete_thread(self, thread_id: str) -> None:
        """Append a tombstone: the thread reads as empty; its log and blobs stay until ``baton purge``."""
        thread_id = str(thread_id)
        if self.index.heads(thread_id)[0] is None:
            return
        with self._writer.ordered(thread_id):
            self._writer.append(thread_id, [DeleteThread("delete_thread")])
            self._forget_values(thread_id)
            self._writer.sync(thread_id)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Hide the checkpoints (and their writes) that these LangGraph runs produced, in every thread."""
        maintenance.hide_runs(self._writer, run_ids)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Append the source's visible checkpoints and writes to the target; blobs are shared, not copied."""
        maintenance.copy_thread(self._writer, str(source_thread_id), str(target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Hide all but the latest checkpoint per namespace (``keep_latest``) or all of them (``delete``)."""
        maintenance.prune(self._writer, thread_ids, strategy)

    # -- LangGraph's API (async): writes await the ledger's async append when they can (``ThreadWriter.aappend``);
    # the rest, and every write the async path declines, runs the sync method in a thread --------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        found = await asyncio.to_thread(lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        put = self._checkpoint_put(config, checkpoint, metadata, new_versions)
        await self._writer.aappend(put.thread_id, [put.command], put.blobs, fold=True)
        return _stored(put)

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        if writes:
            thread_id, commands, blobs = self._writes_put(config, writes, task_id, task_path)
            await self._writer.aappend(thread_id, commands, blobs, fold=True)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)

    # -- internals ----------------------------------------------------------------------------

    def _tuples(self, rows: Sequence[CheckpointRow]) -> builtins.list[CheckpointTuple]:
        docs = [decode_document(r.document) for r in rows]
        digests = {digest for doc in docs for _, digest in doc.channels.values()}
        blobs, writes = self.index.load(digests, {r.checkpoint_id for r in rows}) if rows else ({}, [])
        pending: dict[tuple[str, str, str], list[WriteRow]] = {}
        for w in writes:
            pending.setdefault((w.run_id, w.checkpoint_ns, w.checkpoint_id), []).append(w)
        loads = self.serde.loads_typed
        found: builtins.list[CheckpointTuple] = []
        for row, doc in zip(rows, docs, strict=True):
            checkpoint: Checkpoint = loads(doc.checkpoint)
            checkpoint["channel_values"] = {
                channel: loads((kind, blobs[digest]))
                for channel, (kind, digest) in doc.channels.items()
                if digest in blobs
            }
            for channel, value in doc.inline.items():
                checkpoint["channel_values"][channel] = loads(value)
            ws = sorted(pending.get((row.run_id, row.checkpoint_ns, row.checkpoint_id), ()), key=_write_order)
            conf = {"thread_id": row.run_id, "checkpoint_ns": row.checkpoint_ns}
            found.append(
                CheckpointTuple(
                    config={"configurable": {**conf, "checkpoint_id": row.checkpoint_id}},
                    checkpoint=checkpoint,
                    metadata=loads(doc.metadata),
                    parent_config={"configurable": {**conf, "checkpoint_id": row.parent_id}} if row.parent_id else None,
                    pending_writes=[(w.task_id, w.channel, loads((w.kind, w.data))) for w in ws],
                )
            )
        return found

    def _catch_up(self, thread_id: str, head: int, indexed: int) -> None:
        """A read found the index behind the log after this saver's folds: another process wrote the
        thread, or a fold missed (logged where it did)."""
        log.debug("thread %r: the index is at %d, the log at %d: catching up", thread_id, indexed, head)
        self._writer.sync(thread_id)

    def _cached(self, key: tuple[str, str, str, Any]) -> tuple[str, str | bytes] | None:
        with self._lock:
            return self._values.get(key)

    def _cache(self, key: tuple[str, str, str, Any], ref: tuple[str, str | bytes]) -> None:
        with self._lock:
            self._values[key] = ref
            if len(self._values) > _CACHE:
                self._values.popitem(last=False)

    def _forget_values(self, thread_id: str) -> None:
        with self._lock:
            for key in [k for k in self._values if k[0] == thread_id]:
                del self._values[key]


def _write_order(w: WriteRow) -> tuple[str, str, int]:
    return writes_sort_key(w.task_path, w.task_id, w.idx)


def _stored(put: _Put) -> RunnableConfig:
    c = put.command
    return {
        "configurable": {"thread_id": put.thread_id, "checkpoint_ns": c.checkpoint_ns, "checkpoint_id": c.checkpoint_id}
    }


def _store_url() -> str:
    from baton.adapters.settings import StoreSettings  # noqa: PLC0415 - only for the default URL

    return StoreSettings.resolve(None).url
