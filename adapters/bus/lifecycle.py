"""Starting and stopping a bus app: the same for NATS and Kafka."""

from __future__ import annotations

from typing import Self

from faststream import FastStream

__all__ = ["BusLifecycle"]


class BusLifecycle:
    """Start and stop the FastStream app in ``self.app``, also as an async context manager."""

    app: FastStream

    async def start(self) -> None:
        await self.app.start()

    async def stop(self) -> None:
        await self.app.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
