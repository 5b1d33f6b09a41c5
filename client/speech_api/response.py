"""HTTP responses that notice the client leaving (a stream, and a whole answer still computing).

Starlette's StreamingResponse only finds out at the next write; this one also listens for
`http.disconnect` while waiting for audio, and cancels the body at once, which closes the Triton
stream and so frees the engine slot.
"""
from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator, Awaitable, Callable

from starlette.responses import Response

from client.speech_api.errors import from_triton
from client.triton_stream import TritonStreamError, uncancelled

log = logging.getLogger("omni.speech_api")


class AudioStreamResponse(Response):
    """Subclassing Response only tells FastAPI to pass it through untouched. `close` frees what the
    body holds (its Triton stream, its admission slot) also when the body never started: closing
    an async generator that never ran skips its `finally` (a client gone before the first write)."""

    def __init__(self, body: AsyncIterator[bytes], media_type: str, headers: dict[str, str] | None = None,
                 status_code: int = 200, close: Callable[[], Awaitable[None]] | None = None):
        self.body_iterator = body
        self.close = close
        self.status_code = status_code
        self.background = None
        self.stream_headers = {"content-type": media_type, "cache-control": "no-store", **(headers or {})}
        self.raw_headers = []  # what FastAPI may add (sub-response headers)

    async def __call__(self, scope, receive, send) -> None:
        streamer = asyncio.create_task(self._stream(send))
        watcher = asyncio.create_task(self._watch(receive))
        try:
            done, _ = await asyncio.wait({streamer, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (streamer, watcher):
                if not task.done():
                    task.cancel()
            await asyncio.gather(streamer, watcher, return_exceptions=True)
            try:
                await self.body_iterator.aclose()
            finally:
                if self.close is not None:
                    await self.close()
        if streamer in done and not streamer.cancelled() and streamer.exception() is not None:
            e = streamer.exception()
            if not isinstance(e, OSError):  # OSError: the client went away during a write
                log.error("stream aborted after the status line: %s: %s", type(e).__name__, e)
            # Returning without the final empty body part makes the server cut the connection,
            # which is how a client learns that a 200 stream failed part-way.

    async def _stream(self, send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": [*((k.encode("latin-1"), v.encode("latin-1")) for k, v in self.stream_headers.items()),
                                *self.raw_headers]})
        async for data in self.body_iterator:
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _watch(receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return


class WatchedResponse(Response):
    """A whole answer (status, headers, body) computed while the client is watched: a client
    that hangs up before it is ready cancels the computation (which closes its Triton stream),
    where a plain route would compute it to the end for nobody."""

    def __init__(self, answer: Awaitable[tuple[int, dict[str, str], bytes]], media_type: str,
                 headers: dict[str, str] | None = None, abandon: Callable[[], Awaitable[None]] | None = None):
        self.answer = answer
        self.abandon = abandon   # frees what `answer` holds when it is cancelled before it ran
        self.media_type = media_type
        self.background = None
        self.extra_headers = dict(headers or {})
        self.raw_headers = []  # what FastAPI may add (sub-response headers)

    async def __call__(self, scope, receive, send) -> None:
        # grpc.aio's own cancel of a call under it is no client leaving: it fails, coded
        computing = asyncio.ensure_future(uncancelled(self.answer))
        watcher = asyncio.create_task(AudioStreamResponse._watch(receive))
        try:
            await asyncio.wait({computing, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (computing, watcher):
                if not task.done():
                    task.cancel()
            await asyncio.gather(computing, watcher, return_exceptions=True)
        if computing.cancelled():   # the client left: nobody to answer
            if self.abandon is not None:
                await self.abandon()
            return
        try:
            status, headers, body = computing.result()   # an unexpected exception: the 500 envelope
        except TritonStreamError as e:
            raise from_triton(str(e)) from None
        headers = {"content-type": self.media_type, "cache-control": "no-store", **self.extra_headers, **headers}
        await send({"type": "http.response.start", "status": status,
                    "headers": [*((k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()),
                                *self.raw_headers]})
        await send({"type": "http.response.body", "body": body, "more_body": False})
