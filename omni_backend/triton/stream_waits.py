"""How a stream awaits its steps: watching for its client leaving, several streams read in arrival
order, and never holding the stream in a reference cycle.

An exception raised in a frame keeps that frame in its traceback. When the frame also holds the
future the exception came from (a local `fut`, a `done` set), frame, future and exception form a
cycle that only a full garbage collection frees, and with it everything the frame reaches: the
stream's context, its stage streams, the audio they buffered. Every stream ends with a
StopAsyncIteration, so a cycle per stream built up to tens of MB per process under load and stayed
while the process was idle (nothing allocates, so nothing collects). Hence ended streams are seen
through `Future.exception()`, and a raising result leaves no future in the frame.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

from omni_backend.errors import Cancelled

K = TypeVar("K")


def drop_result(fut: "asyncio.Future") -> None:
    """A done-callback for a future abandoned on purpose: its outcome is marked read."""
    if not fut.cancelled():
        fut.exception()


async def watched(awaitable: Awaitable, cancelled: Callable[[], bool], poll_s: float) -> Any:
    """`awaitable`'s result (or its exception), checking `cancelled()` every `poll_s`; Cancelled
    once it is true (the awaitable is left to finish, its outcome dropped)."""
    fut = asyncio.ensure_future(awaitable)
    while True:
        await asyncio.wait({fut}, timeout=poll_s)
        if fut.done():
            try:
                return fut.result()
            finally:
                del fut   # see the module doc
        if cancelled():
            fut.add_done_callback(drop_result)
            raise Cancelled()


async def in_arrival_order(streams: list[tuple[K, AsyncIterator]], rank: Callable[[K], int],
                           wait: Callable[[Awaitable], Awaitable]) -> AsyncIterator[tuple[K, Any]]:
    """(key, item) from every stream as items arrive, until all have ended; items that arrive
    together come in `rank` order of their keys. `wait` awaits each step (a watched wait).

    Closed early (the client left, an abort, another stream's error), it first stops the steps
    still running: a generator cannot be closed while it runs, and its work must not outlive the
    stream. Steps that ended meanwhile are left unread on purpose."""
    pending: dict[asyncio.Future, tuple[K, AsyncIterator]] = {}
    try:
        for key, stream in streams:
            iterator = stream.__aiter__()
            pending[asyncio.ensure_future(iterator.__anext__())] = (key, iterator)
        while pending:
            done, _ = await wait(asyncio.wait(set(pending), return_when=asyncio.FIRST_COMPLETED))
            for fut in sorted(done, key=lambda f: rank(pending[f][0])):
                key, iterator = pending.pop(fut)
                if isinstance(fut.exception(), StopAsyncIteration):   # looked at, not raised
                    continue
                item = fut.result()
                pending[asyncio.ensure_future(iterator.__anext__())] = (key, iterator)
                yield key, item
    finally:
        running = [fut for fut in pending if not fut.done()]
        for fut in running:
            fut.cancel()
        cancelled = False
        while running:
            # a second cancellation (a cancel message after the client was seen gone) must not cut
            # this short: a step left running keeps its generator busy, and closing that
            # generator then fails ("aclose(): asynchronous generator is already running")
            try:
                await asyncio.wait(running)
                break
            except asyncio.CancelledError:
                cancelled = True
        for fut in pending:
            drop_result(fut)
        if cancelled:
            raise asyncio.CancelledError()
