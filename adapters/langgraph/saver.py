"""``BatonSaver``: LangGraph's ``BaseCheckpointSaver`` on a Baton ledger (docs/langgraph.md).

Each thread is a Baton run (run id = thread id); each checkpoint and each batch of pending writes is
an event in that run's hash-chained log, appended under the thread's lease. Channel values,
checkpoints and writes are blobs by digest; reads go to the thread index, never to a log scan.

Fencing: the saver takes the thread's lease on first use (opening the run if needed) and renews
it when less than half its ttl is left. Once it has held a thread, it never silently takes it
back: if another worker moved the epoch on, every write raises ``StaleEpoch``.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
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
from baton.adapters.eventstore.fenced import Riders
from baton.adapters.identity import SigningKey
from baton.adapters.langgraph.document import Document, decode_document
from baton.adapters.langgraph.index import CheckpointRow, ThreadIndex, WriteRow
from baton.domain import errors
from baton.domain.commands import (
    AcquireLease,
    Command,
    DeleteThread,
    HideCheckpoints,
    OpenRun,
    PruneThread,
    PutCheckpoint,
    PutWrites,
    ReleaseLease,
    RenewLease,
    Submission,
    Verdict,
)
from baton.domain.events import BlobRef, ChannelWrite, CheckpointRecorded, Event, Placement, WritesRecorded

__all__ = ["BatonSaver"]

SCHEMA_NAME = "langgraph.checkpoint"
_TASK_REF = BlobRef("sha256:" + "0" * 64, 0, "langgraph:thread")
_MAX_ITEMS = 256  # the domain's bound on list lengths
_BATCH = 500  # commands per append when copying a thread
_CACHE = 65_536
_INLINE = 64  # serialized values up to this size live in the document (a digest there takes 71 bytes)
_doc_encoder = msgspec.msgpack.Encoder()
_REJECTIONS: dict[str, type[errors.BatonError]] = {
    cls.reason: cls for cls in errors.Rejection.__subclasses__() if "__init__" not in vars(cls)
} | {errors.ConcurrencyConflict.reason: errors.ConcurrencyConflict}


class _Lease(msgspec.Struct):
    epoch: int
    expires_at: int


class _Fold(NamedTuple):
    """An index update not yet written: ``events`` move the thread's index from ``expected`` to ``upto``."""

    expected: int
    upto: int
    events: builtins.list[tuple[int, Event]]
    docs: dict[str, bytes]


class _Put(NamedTuple):
    """A checkpoint ready to append: its command, the blobs it references, and its document's bytes."""

    thread_id: str
    command: PutCheckpoint
    blobs: dict[str, bytes]
    document: bytes


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
        self._leases: dict[str, _Lease] = {}
        self._stale: dict[str, int] = {}  # threads this saver lost: the epoch that moved on
        # the index fold of each thread's last append, sent in the next append's statement (or before a read)
        self._pending: dict[str, _Fold] = {}
        # (thread, ns, channel, version) -> (kind, digest) of a blob, or (kind, bytes) of an inline value
        self._values: OrderedDict[tuple[str, str, str, Any], tuple[str, str | bytes]] = OrderedDict()
        self._lock = threading.Lock()
        self._lease_lock = threading.RLock()

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
        """Release the leases this saver holds (so another worker may resume at once), then disconnect."""
        self._flush()
        if release:
            for run_id in list(self._leases):
                self.release(run_id)
        if self._owns:
            self.ledger.close()
            self.conn.close()

    def _submission(self, run_id: str, command: Command, epoch: int) -> Submission:
        submission = Submission(_sid(), run_id, self.worker, command, epoch)
        return self.key.sign(submission) if self.key is not None else submission

    def release(self, thread_id: str) -> None:
        """Give the thread's lease back; a later write by this saver takes it again if nobody else has."""
        held = self._leases.pop(thread_id, None)
        if held is not None:
            self.ledger.submit(self._submission(thread_id, ReleaseLease(), held.epoch))

    def forget(self, thread_id: str) -> None:
        """Let this saver take a thread it lost again (after the application has re-read the thread)."""
        self._stale.pop(str(thread_id), None)
        self._leases.pop(str(thread_id), None)

    # -- LangGraph's API (sync) ---------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        conf = config["configurable"]
        thread_id, ns, checkpoint_id = str(conf["thread_id"]), conf.get("checkpoint_ns", ""), conf.get("checkpoint_id")
        self._flush(thread_id)
        head, indexed, row = self.index.lookup(thread_id, ns, checkpoint_id)
        if head is None:
            return None
        if indexed != head:
            self._sync(thread_id)
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
        self._flush(thread_id)
        if thread_id is not None:
            head, indexed = self.index.heads(thread_id)
            if head is None:
                return
            if indexed != head:
                self._sync(thread_id)
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
        return self._checkpoint_recorded(put, self._append(put.thread_id, [put.command], put.blobs)[0])

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
        return _Put(thread_id, PutCheckpoint(ns, checkpoint["id"], doc_ref, parent, run_tag), blobs, data)

    def _checkpoint_recorded(self, put: _Put, verdict: Verdict) -> RunnableConfig:
        c = put.command
        body = CheckpointRecorded(c.checkpoint_ns, c.checkpoint_id, c.document, c.parent_checkpoint_id, c.run_tag)
        self._defer(put.thread_id, [(_position(verdict), body)], {c.document.digest: put.document})
        conf = {"thread_id": put.thread_id, "checkpoint_ns": c.checkpoint_ns, "checkpoint_id": c.checkpoint_id}
        return {"configurable": conf}

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        if writes:
            thread_id, commands, blobs = self._writes_put(config, writes, task_id, task_path)
            self._writes_recorded(thread_id, commands, self._append(thread_id, commands, blobs))

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
            PutWrites(ns, checkpoint_id, task_id, tuple(items[i : i + _MAX_ITEMS]), task_path)
            for i in range(0, len(items), _MAX_ITEMS)
        ]
        return thread_id, commands, blobs

    def _writes_recorded(self, thread_id: str, commands: Sequence[Command], verdicts: Sequence[Verdict]) -> None:
        events: builtins.list[tuple[int, Event]] = [
            (_position(v), WritesRecorded(c.checkpoint_ns, c.checkpoint_id, c.task_id, c.writes, c.task_path))
            for v, c in zip(verdicts, commands, strict=True)
            if isinstance(c, PutWrites)
        ]
        self._defer(thread_id, events, {})

    def delete_thread(self, thread_id: str) -> None:
        """Append a tombstone: the thread reads as empty; its log and blobs stay until ``baton purge``."""
        thread_id = str(thread_id)
        if self.index.heads(thread_id)[0] is None:
            return
        self._append(thread_id, [DeleteThread("delete_thread")])
        self._forget_values(thread_id)
        self._sync(thread_id)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Hide the checkpoints (and their writes) that these LangGraph runs produced, in every thread."""
        tags = sorted({str(r) for r in run_ids})
        if not tags:
            return
        self._flush()
        for thread_id in self.index.runs_tagged(tags):
            chunks = [tuple(tags[i : i + _MAX_ITEMS]) for i in range(0, len(tags), _MAX_ITEMS)]
            self._append(thread_id, [HideCheckpoints(chunk) for chunk in chunks])
            self._sync(thread_id)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Append the source's visible checkpoints and writes to the target; blobs are shared, not copied."""
        source, target = str(source_thread_id), str(target_thread_id)
        self._flush(source)
        head, indexed = self.index.heads(source)
        if head is None:
            return
        if indexed != head:
            self._sync(source)
        commands: builtins.list[Command] = [
            PutCheckpoint(
                r.checkpoint_ns,
                r.checkpoint_id,
                BlobRef(blob_digest(r.document), len(r.document)),
                r.parent_id,
                r.run_tag,
            )
            for r in self.index.checkpoints(source, oldest_first=True)
        ]
        grouped: dict[tuple[str, str, str, str], list[ChannelWrite]] = {}
        for ns, checkpoint_id, task_id, idx, channel, kind, digest, task_path in self.index.writes_of(source):
            grouped.setdefault((ns, checkpoint_id, task_id, task_path), []).append(
                ChannelWrite(channel, idx, kind, BlobRef(digest, 0))
            )
        for (ns, checkpoint_id, task_id, task_path), items in grouped.items():
            for i in range(0, len(items), _MAX_ITEMS):
                commands.append(PutWrites(ns, checkpoint_id, task_id, tuple(items[i : i + _MAX_ITEMS]), task_path))
        for i in range(0, len(commands), _BATCH):
            self._append(target, commands[i : i + _BATCH])
        self._sync(target)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Hide all but the latest checkpoint per namespace (``keep_latest``) or all of them (``delete``)."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        for thread_id in map(str, thread_ids):
            if self.index.heads(thread_id)[0] is None:
                continue
            self._append(thread_id, [PruneThread("delete" if strategy == "delete" else "keep_latest")])
            self._sync(thread_id)

    # -- LangGraph's API (async): writes await the ledger's async append when they can (``_aappend``);
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
        return self._checkpoint_recorded(put, (await self._aappend(put.thread_id, [put.command], put.blobs))[0])

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        if writes:
            thread_id, commands, blobs = self._writes_put(config, writes, task_id, task_path)
            self._writes_recorded(thread_id, commands, await self._aappend(thread_id, commands, blobs))

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

    def _append(
        self, run_id: str, commands: Sequence[Command], blobs: dict[str, bytes] | None = None
    ) -> builtins.list[Verdict]:
        """Append under this saver's lease (taken or renewed first, in the same transaction when it can).

        The blobs the commands reference, and the thread's pending index fold, go in the append's own
        statement where the store can (PostgreSQL): a put is one round trip. Elsewhere they are
        written just before it.
        """
        return self._append_riding(run_id, commands, self._rider(run_id, blobs or {}))

    async def _aappend(
        self, run_id: str, commands: Sequence[Command], blobs: dict[str, bytes]
    ) -> builtins.list[Verdict]:
        """``_append`` from the event loop: one awaited statement when the lease needs no command.

        Otherwise, or when the ledger declines (``RunLedger.asubmit``), the sync path runs in a thread
        with the same submission, so a try that did commit is answered ``duplicate``, never appended twice.
        """
        epoch = self._held(run_id)
        if epoch is None or len(commands) != 1 or self.ledger.async_appends is None:
            return await asyncio.to_thread(self._append, run_id, commands, blobs)
        rider = self._rider(run_id, blobs)  # pure CPU on PostgreSQL: the saver's folds are checkpoints and writes
        first = self._submission(run_id, commands[0], epoch)
        verdict = await self.ledger.asubmit(first, riders=rider)
        if verdict is not None:
            return [verdict]
        return await asyncio.to_thread(self._append_riding, run_id, commands, rider, first)

    def _append_riding(
        self,
        run_id: str,
        commands: Sequence[Command],
        rider: Riders | None,
        first: Submission | None = None,
    ) -> builtins.list[Verdict]:
        """``_append`` with its rider made; ``first``: the submission of ``commands`` tried already elsewhere."""
        riding = getattr(self.ledger.recorder, "riding", None)  # FencedPostgresRecorder's
        for attempt in range(2):
            epoch, lease = self._lease(run_id)
            if first is not None and attempt == 0 and first.epoch != epoch:
                # The lease moved since the first try: that try may still have committed (a lost reply),
                # and a new submission would append the same checkpoint again.
                recorded = self.ledger.recorder.select_submission(first.submission_id)  # type: ignore[attr-defined]
                if recorded is not None:
                    return [Verdict(first.submission_id, "duplicate", run_id, position=recorded.position)]
            ours = (
                [first]
                if first is not None and attempt == 0 and first.epoch == epoch
                else [self._submission(run_id, c, epoch) for c in commands]
            )
            submissions = [*(self._submission(run_id, c, epoch) for c in lease), *ours]
            with riding(*rider) if rider is not None and riding is not None else contextlib.nullcontext():
                if len(submissions) == 1:
                    verdicts = [self.ledger.submit(submissions[0])]
                else:
                    verdicts = self.ledger.submit_many(submissions)
            rejected = next((v for v in verdicts if v.verdict == "rejected"), None)
            if rejected is None:
                if lease:
                    self._leases[run_id] = _Lease(epoch, self.ledger.clock.now() + self.ttl_ms * 1000)
                    if len(lease) == 1 and isinstance(lease[0], RenewLease):  # one event, nothing for the index
                        renewed = _position(verdicts[0])
                        self._defer_fold(run_id, _Fold(renewed - 1, renewed, [], {}))
                return verdicts[len(lease) :]
            if rejected.reason == "lease_expired" and attempt == 0 and run_id in self._leases:
                self._leases[run_id].expires_at = 0  # judged expired by the store's clock: take it again
                continue
            if rejected.reason == "stale_epoch":
                self._leases.pop(run_id, None)
                self._stale[run_id] = rejected.current_epoch or 0
            raise _error(rejected)
        raise AssertionError("unreachable")  # pragma: no cover

    def _held(self, run_id: str) -> int | None:
        """The epoch of this saver's lease on the thread when an append needs no lease command (no I/O)."""
        held = self._leases.get(run_id)
        if held is None or run_id in self._stale:
            return None
        return held.epoch if held.expires_at - self.ledger.clock.now() >= self.ttl_ms * 500 else None

    def _lease(self, run_id: str) -> tuple[int, builtins.list[Command]]:
        """The epoch to append under, and the lease commands that must go first."""
        if run_id in self._stale:
            msg = (
                f"{self.worker!r} lost thread {run_id!r} to epoch {self._stale[run_id]}; call forget() to take it again"
            )
            raise errors.StaleEpoch(msg, current_epoch=self._stale[run_id])
        now = self.ledger.clock.now()
        held = self._leases.get(run_id)
        if held is not None and now < held.expires_at:
            renew = held.expires_at - now < self.ttl_ms * 500  # less than half the ttl left
            return held.epoch, [RenewLease(self.ttl_ms)] if renew else []
        with self._lease_lock:  # LangGraph writes from several threads: take a thread's lease once
            if held is None and run_id in self._leases:
                return self._lease(run_id)
            return self._take(run_id, held, now)

    def _take(self, run_id: str, held: _Lease | None, now: int) -> tuple[int, builtins.list[Command]]:
        state = self.ledger.state(run_id)
        if held is not None and state.epoch != held.epoch:
            self._leases.pop(run_id, None)
            self._stale[run_id] = state.epoch
            msg = (
                f"{self.worker!r} held thread {run_id!r} at epoch {held.epoch}; epoch {state.epoch} is "
                f"held by {state.holder!r}: this saver is stale and will not fork the thread"
            )
            raise errors.StaleEpoch(msg, current_epoch=state.epoch)
        if state.lease is not None and state.lease.worker == self.worker and now < state.lease.expires_at:
            return state.epoch, [RenewLease(self.ttl_ms)]  # ours already (a restarted saver of the same worker)
        acquire = AcquireLease(Placement(self.worker), self.ttl_ms)
        steps: builtins.list[Command] = (
            [acquire] if state.opened else [OpenRun("langgraph", SCHEMA_NAME, 1, _TASK_REF), acquire]
        )
        verdicts = self.ledger.submit_many([self._submission(run_id, c, 0) for c in steps])
        for verdict in verdicts:
            if verdict.verdict == "rejected" and verdict.reason != "run_exists":
                raise _error(verdict)
        if len(verdicts) == 2 and verdicts[0].verdict == verdicts[1].verdict == "accepted":
            opened, granted = _position(verdicts[0]), _position(verdicts[1])
            if opened == granted - 1:  # positions 1..granted are ours and hold nothing for the index
                self._defer_fold(run_id, _Fold(0, granted, [], {}))
        state = self.ledger.state(run_id)
        if state.lease is None or state.lease.worker != self.worker:  # pragma: no cover - a lost race
            raise errors.LeaseHeld(f"thread {run_id!r} is held by {state.holder!r}")
        self._leases[run_id] = _Lease(state.epoch, state.lease.expires_at)
        return state.epoch, []

    def _defer(self, run_id: str, events: Sequence[tuple[int, Event]], docs: dict[str, bytes]) -> None:
        self._defer_fold(run_id, _Fold(events[0][0] - 1, events[-1][0], [*events], docs))

    def _defer_fold(self, run_id: str, fold: _Fold) -> None:
        """Keep ``fold`` for the thread's next append, joined onto the pending one when it continues it."""
        with self._lock:
            before = self._pending.get(run_id)
            if before is not None and before.upto == fold.expected:
                fold = _Fold(before.expected, fold.upto, [*before.events, *fold.events], before.docs | fold.docs)
            self._pending[run_id] = fold

    def _rider(self, run_id: str, blobs: dict[str, bytes]) -> Riders | None:
        """What rides in the append's statement: the blobs and the thread's pending fold (PostgreSQL).

        A fold whose compare-and-set misses (a lease event came between, or another process
        caught the index up) is dropped: the next read finds the index behind the log and catches up.
        Without a recorder that takes riders (SQLite), or for a fold of hiding events, they are
        written here, before the append, as one statement or transaction of their own.
        """
        with self._lock:
            pending = self._pending.pop(run_id, None)
        rides = hasattr(self.ledger.recorder, "riding")
        ctes: builtins.list[str] = []
        params: builtins.list[Any] = []
        if pending is not None and rides:
            clauses = self.index.fold_clauses(run_id, pending.expected, pending.events, pending.docs, upto=pending.upto)
            if clauses is not None:
                ctes, params = clauses
                pending = None
        if not rides or pending is not None:
            if pending is not None:
                self.index.record(
                    run_id, pending.expected, pending.events, pending.docs, blobs=blobs, upto=pending.upto
                )
            elif blobs:
                self.blobs.put(blobs)
            blobs = {}
        if blobs:
            clause, extra = BlobStore.insert_clause(blobs, "lg_blobs")
            ctes, params = [*ctes, clause], [*params, *extra]
        return (", ".join(ctes), params) if ctes else None

    def _flush(self, run_id: str | None = None) -> None:
        """Fold pending index updates (one thread's, or all) before reading the index."""
        with self._lock:
            if run_id is None:
                pending, self._pending = self._pending, {}
            else:
                one = self._pending.pop(run_id, None)
                pending = {run_id: one} if one is not None else {}
        for thread, fold in pending.items():
            self.index.record(thread, fold.expected, fold.events, fold.docs, upto=fold.upto)

    def _sync(self, run_id: str) -> None:
        self._flush(run_id)
        self.index.catch_up(run_id, lambda after: self.ledger.history(run_id, after=after))

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


def _sid() -> str:
    return "lg-" + uuid.uuid4().hex


def _position(verdict: Verdict) -> int:
    assert verdict.position is not None, "an accepted verdict carries its position"
    return verdict.position


def _store_url() -> str:
    from baton.adapters.settings import StoreSettings  # noqa: PLC0415 - only for the default URL

    return StoreSettings.resolve(None).url


def _error(verdict: Verdict) -> errors.BatonError:
    message = verdict.message or verdict.reason or "rejected"
    if verdict.reason == "stale_epoch":
        return errors.StaleEpoch(message, current_epoch=verdict.current_epoch or 0)
    return _REJECTIONS.get(verdict.reason or "", errors.Rejection)(message)
