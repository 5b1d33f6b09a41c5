"""A streamed HTTP response that notices the client leaving.

Starlette's StreamingResponse only finds out at the next write; this one also listens for
`http.disconnect` while waiting for audio, and cancels the body at once, which closes the Triton
stream and so frees the engine slot.
"""
from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator

from starlette.responses import Response

log = logging.getLogger("omni.speech_api")


class AudioStreamResponse(Response):
    """Subclassing Response only tells FastAPI to pass it through untouched."""

    def __init__(self, body: AsyncIterator[bytes], media_type: str, headers: dict[str, str] | None = None,
                 status_code: int = 200):
        self.body_iterator = body
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
            await self.body_iterator.aclose()
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
