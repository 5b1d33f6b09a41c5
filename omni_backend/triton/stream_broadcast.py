"""One stage's stream read by several consumers (the entry's stage graph: the stages it feeds,
or the client too)."""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator


class Broadcast:
    """Each tap sees every item; the source is read as fast as the fastest tap wants."""

    def __init__(self, source: AsyncIterator[Any], taps: int):
        self.source = source
        self.queues: list[asyncio.Queue] = [asyncio.Queue() for _ in range(taps)]
        self.task: asyncio.Task | None = None
        self.handed = 0

    async def _pump(self) -> None:
        try:
            async for item in self.source:
                for q in self.queues:
                    q.put_nowait(("item", item))
            for q in self.queues:
                q.put_nowait(("end", None))
        except BaseException as e:   # every tap raises it
            for q in self.queues:
                q.put_nowait(("error", e))
            if isinstance(e, asyncio.CancelledError):
                raise

    def tap(self) -> AsyncIterator[Any]:
        queue = self.queues[self.handed]
        self.handed += 1
        return self._read(queue)

    async def _read(self, queue: asyncio.Queue) -> AsyncIterator[Any]:
        if self.task is None:
            self.task = asyncio.ensure_future(self._pump())
        while True:
            kind, value = await queue.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value

    async def aclose(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.wait({self.task})
