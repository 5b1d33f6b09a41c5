"""One speech response: Triton stream -> speed -> encoder -> bytes (or SSE events).

`start()` runs before the HTTP status line: it takes a stream slot, opens the Triton stream and
waits for the first audio, so bad input, overload and dead servers become real HTTP errors.
`body()` then yields bytes as each chunk is encoded; closing it (client gone) closes the Triton
stream, which cancels the request inside Triton.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator

import numpy as np

from client.speech_api import sse
from client.speech_api.admission import StreamLimiter
from client.speech_api.admitted_stream import AdmittedStream
from client.speech_api.encoders import make_encoder
from client.speech_api.errors import ApiError, internal
from client.speech_api.pool import TritonPool
from client.speech_api.request import TritonRequest
from client.speech_api.speed import TimeStretch

log = logging.getLogger("omni.speech_api")
FIRST_SLICE_S = 0.1   # audio encoded before the first bytes go out
SLICE_S = 0.5         # then at most this much per encoder call


class SpeechSynthesis(AdmittedStream):
    def __init__(self, pool: TritonPool, limiter: StreamLimiter, request: TritonRequest,
                 response_format: str, stream_format: str, request_id: str, access: dict[str, Any],
                 model_rate: int | None = None):
        super().__init__(pool, limiter, request.pipeline, request_id, access)
        self.request = request
        self.response_format = response_format
        self.stream_format = stream_format
        self.model_rate = model_rate or 24000   # the pipeline's declared rate, for a stream with no audio

    async def start(self) -> None:
        await self.open(self.request.text, self.request.params)
        self.sample_rate = self.stream.first[1] if self.stream.first is not None else self.model_rate

    async def _encoded(self) -> AsyncIterator[bytes]:
        """Encoded bytes, as soon as the encoder lets them go. Stretching and encoding run in
        worker threads (the codecs release the GIL), so one stream's encoding never holds up
        the event loop that serves every other stream."""
        assert self.stream is not None
        loop = asyncio.get_running_loop()
        self._encoder = self._stretch = None
        async for audio, rate in self.stream.chunks():
            if self._encoder is None:
                await loop.run_in_executor(None, self._open_encoder, rate)
            for piece in self._slices(audio, rate):
                data = await loop.run_in_executor(None, self._encode, piece)
                if data:
                    yield data
        if self._encoder is None:  # no audio at all: an empty but well-formed file
            await loop.run_in_executor(None, self._open_encoder, self.sample_rate)
        data = await loop.run_in_executor(None, self._finish)
        if data:
            yield data
        self._finished = True

    def _slices(self, audio: np.ndarray, rate: int) -> list[np.ndarray]:
        """A long chunk (a pipeline may send a sentence at a time) is encoded in slices, the very first
        one short, so the first bytes leave after milliseconds of encoding, not a sentence's."""
        first = int(rate * FIRST_SLICE_S) if self.audio_samples == 0 else 0
        step = int(rate * SLICE_S)
        cuts = ([first] if 0 < first < audio.size else []) + list(range(first + step, audio.size, step))
        return np.split(audio, cuts) if cuts else [audio]

    def _open_encoder(self, rate: int) -> None:
        self.sample_rate = rate
        self._encoder = make_encoder(self.response_format, rate)
        if self.request.speed.stretch != 1.0:
            self._stretch = TimeStretch(self.request.speed.stretch, rate)

    def _encode(self, audio: np.ndarray) -> bytes:
        if self._stretch is not None:
            audio = self._stretch.push(audio)
        self.audio_samples += audio.size
        return self._encoder.encode(audio)

    def _finish(self) -> bytes:
        tail = self._stretch.flush() if self._stretch is not None else np.zeros(0, np.float32)
        self.audio_samples += tail.size
        return (self._encoder.encode(tail) if tail.size else b"") + self._encoder.finish()

    async def body(self) -> AsyncIterator[bytes]:
        try:
            if self.stream_format == "sse":
                async for data in self._sse():
                    yield data
            else:
                async for data in self._encoded():
                    yield data
        finally:
            await self.close()

    async def whole(self) -> tuple[int, dict[str, str], bytes]:
        """The whole file (`stream: false`): a failure part-way is an error status, not a cut body."""
        try:
            data = b"".join([part async for part in self.body()])
            return 200, {"content-length": str(len(data))}, data
        except ApiError as e:
            self.access["error"] = e.code
            self.access["outcome"] = f"error {e.status}"
            return e.status, e.headers, e.body()

    async def _sse(self) -> AsyncIterator[bytes]:
        try:
            async for data in self._encoded():
                yield sse.delta(data)
        except ApiError as e:
            self.access["outcome"] = f"error {e.status}"
            yield sse.error(e.sse_event())
            return
        except Exception as e:  # noqa: BLE001 - the client gets an error event, not a cut stream
            log.exception("request %s failed mid-stream", self.request_id)
            self.access["outcome"] = "error 500"
            yield sse.error(internal(f"{type(e).__name__}: {e}").sse_event())
            return
        yield sse.done(self.request.text, self.audio_seconds)
