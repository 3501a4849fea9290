"""Run partitions that move between services by themselves: leases in a JetStream key-value bucket.

``baton serve --partitions auto:N`` shares the N partitions of ``partition_mapping(N)`` with every
other service started the same way. Each service keeps a member key alive in the bucket
``baton_partitions`` and holds an even share of the partitions, each as a key naming it; the
bucket's ttl ends the keys of a service that stops renewing them (killed, or cut off), and the
others take its partitions on their next round. A service that joins (or comes back) takes free
partitions up to its share, and the others give up what they hold above theirs, so load spreads
again without anyone changing flags.

A lease here is for locality, not for safety: the service that holds a partition keeps its runs'
states cached and current. Two services answering one partition for a moment (a release, a
takeover) is harmless, because every append is fenced in PostgreSQL; the only cost is a cache miss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import uuid
from collections.abc import Awaitable, Callable

from nats.aio.client import Client as NatsClient
from nats.js.errors import BucketNotFoundError, KeyWrongLastSequenceError, NoKeysError
from nats.js.kv import KeyValue

__all__ = ["BUCKET", "PartitionLeases"]

log = logging.getLogger("baton.bus.partitions")

BUCKET = "baton_partitions"
_MEMBER = "member.{id}"
_PARTITION = "p.{k}"


class PartitionLeases:
    """This service's share of ``count`` partitions, claimed and renewed every ``ttl / 3`` seconds.

    ``claim(k)`` and ``give_up(k)`` subscribe and unsubscribe the service's responder; a partition
    given up stays subscribed until the next round, so its new owner is answering before this one
    stops (no gap of "no responders").
    """

    def __init__(
        self,
        nc: NatsClient,
        count: int,
        *,
        claim: Callable[[int], Awaitable[None]],
        give_up: Callable[[int], Awaitable[None]],
        ttl: float = 3.0,
        replicas: int = 1,
    ) -> None:
        self.nc, self.count, self.ttl, self.replicas = nc, count, ttl, replicas
        self._claim, self._give_up = claim, give_up
        self.id = uuid.uuid4().hex[:12]
        self.owned: dict[int, int] = {}  # partition -> revision of our key
        self._leaving: set[int] = set()  # given up in the bucket, unsubscribed next round
        self._task: asyncio.Task[None] | None = None
        self._kv: KeyValue | None = None

    async def start(self) -> None:
        js = self.nc.jetstream()
        try:
            self._kv = await js.key_value(BUCKET)
        except BucketNotFoundError:
            self._kv = await js.create_key_value(bucket=BUCKET, ttl=self.ttl, history=1, replicas=self.replicas)
        await self.round()  # the first share before "ready"
        self._task = asyncio.create_task(self._run(), name="baton-partition-leases")

    async def stop(self) -> None:
        """Give every partition back at once, so the others need not wait for the ttl."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        kv = self._bucket()
        for k, revision in sorted(self.owned.items()):
            with contextlib.suppress(Exception):  # best effort: the ttl ends it otherwise
                await kv.delete(_PARTITION.format(k=k), last=revision)
        with contextlib.suppress(Exception):
            await kv.delete(_MEMBER.format(id=self.id))
        for k in sorted(self.owned.keys() | self._leaving):
            await self._give_up(k)
        self.owned.clear()
        self._leaving.clear()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception:  # a cluster electing a leader, a lost connection: the next round retries
                log.warning("partition leases: round failed; retrying", exc_info=True)

    async def round(self) -> None:
        """Renew what is held, drop what was lost, give up what is above the share, claim up to it."""
        kv = self._bucket()
        for k in sorted(self._leaving):
            await self._give_up(k)
        self._leaving.clear()
        await kv.put(_MEMBER.format(id=self.id), b"")
        for k, revision in sorted(self.owned.items()):
            try:
                self.owned[k] = await kv.update(_PARTITION.format(k=k), self.id.encode(), last=revision)
            except KeyWrongLastSequenceError:  # it expired: renewals failed longer than the ttl
                try:  # nobody took it meanwhile (a bucket electing its leader): still ours, never unsubscribed
                    self.owned[k] = await kv.create(_PARTITION.format(k=k), self.id.encode())
                except KeyWrongLastSequenceError:
                    log.warning("partition %d: lease lost to another service", k)
                    del self.owned[k]
                    await self._give_up(k)
        share = math.ceil(self.count / await self._members())
        for k in sorted(self.owned)[share:]:
            await kv.delete(_PARTITION.format(k=k), last=self.owned.pop(k))
            self._leaving.add(k)
        for k in range(self.count):
            if len(self.owned) >= share:
                break
            if k in self.owned or k in self._leaving:
                continue
            try:
                self.owned[k] = await kv.create(_PARTITION.format(k=k), self.id.encode())
            except KeyWrongLastSequenceError:  # held by another service
                continue
            log.info("partition %d: claimed", k)
            await self._claim(k)

    async def _members(self) -> int:
        try:
            keys = await self._bucket().keys(filters=[_MEMBER.format(id="")])
        except NoKeysError:
            return 1
        return max(1, len(keys))

    def _bucket(self) -> KeyValue:
        if self._kv is None:
            raise RuntimeError("PartitionLeases is not started")
        return self._kv
