"""A Triton stream that takes its text while it runs (asyncio, tritonclient's gRPC aio client).

The pipeline reads text as it arrives (its adapter has `streaming_input`, e.g. Qwen3-TTS): the
stream opens with the first piece; each later piece is a `CONTROL=append` request naming the
stream's request id (omni_backend/triton/text_input.py), sent on a call of its own once the
previous one was answered, so pieces arrive in order. Pieces given while one is on its way are
joined and go in the next request (in slices of at most the entry's 4,096 characters a piece).
`end()` says the text is complete.

    stream = TextInputStream(client, "qwen3_tts", params, request_id)
    stream.start("Hello, ")                  # the audio arrives on stream.chunks()
    await stream.append("world.")
    await stream.end()
    async for audio, rate in stream.chunks(): ...
    await stream.aclose()                    # early: cancels the request in Triton

Errors are `TritonStreamError`s with a stable code (an append refused with `invalid_request`
fails the `append` call; the stream's own failure ends `chunks()`).
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import numpy as np

from client.triton_stream import TritonStreamError, acontrol, astream
from omni_backend.adapters.base import MAX_TEXT_CHARS

STREAMING_INPUT = "streaming_input"


class TextInputStream:
    def __init__(self, client: Any, model: str, params: dict[str, Any] | None, request_id: str):
        if not request_id:
            raise ValueError("a stream that takes text needs a request id")
        self.client = client
        self.model = model
        self.params = {**(params or {}), STREAMING_INPUT: True}
        self.request_id = request_id
        self.ended = False
        self._audio: AsyncIterator | None = None
        self._pending: list[str] = []       # pieces not sent yet
        self._send_lock = asyncio.Lock()
        self._appends = 0
        self._sent_end = False

    def start(self, text: str) -> AsyncIterator[tuple[np.ndarray, int]]:
        """Open the stream with the first piece (not blank); returns the audio iterator (also
        `chunks()`), which must be read for the request to start."""
        self._audio = astream(self.client, self.model, text, self.params, self.request_id)
        return self._audio

    def chunks(self) -> AsyncIterator[tuple[np.ndarray, int]]:
        if self._audio is None:
            raise RuntimeError("start() first")
        return self._audio

    async def append(self, text: str) -> None:
        """Give the stream more text; returns once Triton took it (or joined it to a later send)."""
        if self.ended:
            raise TritonStreamError("invalid_request: end: the text has ended; no more text is taken")
        self._pending.append(text)
        await self._flush(end=False)

    async def end(self) -> None:
        """The text is complete (pieces still waiting go with it)."""
        if self.ended:
            return
        self.ended = True
        await self._flush(end=True)

    async def _flush(self, end: bool) -> None:
        async with self._send_lock:
            if self._sent_end or (not self._pending and not end):
                return   # an earlier call sent this piece along with its own
            piece, self._pending = "".join(self._pending), []
            # joined pieces may pass the entry's limit on one piece: send them in slices under it
            slices = [piece[i:i + MAX_TEXT_CHARS] for i in range(0, len(piece), MAX_TEXT_CHARS)] or [""]
            for i, part in enumerate(slices):
                await self._send(part, self.ended and i == len(slices) - 1)

    async def _send(self, piece: str, end: bool) -> None:
        self._appends += 1
        await acontrol(self.client, self.model, "append", f"{self.request_id}-append-{self._appends}",
                       piece, {"request_id": self.request_id, "end": end})
        if end:
            self._sent_end = True

    async def aclose(self) -> None:
        if self._audio is not None:
            await self._audio.aclose()

