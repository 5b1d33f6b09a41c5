"""One Triton stream held under the speech API's per-pipeline admission (speech, chat and the
WebSocket's utterances).

`open` takes a stream slot of the pipeline, opens the Triton stream and waits for its first
response, so bad input, overload and dead servers become real HTTP errors in OpenAI's envelope
(and the pool moves the stream off an endpoint that cannot take it); `open_text` opens a stream
that takes its text while it runs. `close` closes the stream (cancelling the request inside
Triton when it is still running), frees the slot and records the outcome and audio seconds in
the access log's fields (`access`).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Awaitable, Callable

from client.speech_api.admission import StreamLimiter
from client.speech_api.errors import ApiError, from_triton, internal
from client.speech_api.pool import PoolStream, PoolTextStream, TritonEndpoint, TritonPool
from client.triton_stream import TritonStreamError

log = logging.getLogger("omni.speech_api")


class AdmittedStream:
    def __init__(self, pool: TritonPool, limiter: StreamLimiter, pipeline: str, request_id: str,
                 access: dict[str, Any]):
        self.pool = pool
        self.limiter = limiter
        self.pipeline = pipeline
        self.request_id = request_id
        self.access = access
        self.stream: PoolStream | None = None
        self.sample_rate = 0
        self.audio_samples = 0
        self._admitted = False
        self._finished = False

    @property
    def audio_seconds(self) -> float:
        return self.audio_samples / self.sample_rate if self.sample_rate else 0.0

    async def open(self, text: str, params: dict[str, Any], parts: bool = False,
                   refine: Callable[[ApiError], ApiError] = lambda e: e,
                   prefer: TritonEndpoint | None = None) -> None:
        """Open the stream; `refine` rewrites a coded error for the route (a chat names its own
        fields); `prefer`: the endpoint to use while it can serve (a WebSocket session's own)."""
        t0 = time.perf_counter()
        await self._admit(lambda: self.pool.open_stream(self.pipeline, text, params, self.request_id, parts=parts,
                                                        prefer=prefer), refine)
        self.access["ttfa_ms"] = (time.perf_counter() - t0) * 1000.0   # time to the first response

    async def open_text(self, first_piece: str, params: dict[str, Any],
                        prefer: TritonEndpoint | None = None) -> PoolTextStream:
        """Open a stream that takes its text while it runs (`append`, `end` on what is returned)."""
        await self._admit(lambda: self.pool.open_text_stream(self.pipeline, first_piece, params, self.request_id,
                                                             prefer))
        assert isinstance(self.stream, PoolTextStream)
        return self.stream

    async def _admit(self, opening: Callable[[], Awaitable[PoolStream]],
                     refine: Callable[[ApiError], ApiError] = lambda e: e) -> None:
        """Take a stream slot, then open the stream (`opening()`); every failure frees the slot."""
        self.limiter.acquire(self.pipeline)
        self._admitted = True
        try:
            self.stream = await opening()
        except ApiError as e:
            self._release()
            raise refine(e) from None
        except TritonStreamError as e:   # coded: a request Triton could not take
            self._release()
            raise refine(from_triton(str(e))) from None
        except Exception as e:  # noqa: BLE001 - still the envelope with a code, never a bare 500
            self._release()
            log.exception("request %s: opening the Triton stream failed", self.request_id)
            raise internal(f"{type(e).__name__}: {e}") from None
        except BaseException:
            self._release()
            raise
        self.access["triton"] = self.stream.endpoint.url

    def finished(self) -> None:
        """The stream was read to its end: its outcome is `ok`."""
        self._finished = True

    def _release(self) -> None:
        if self._admitted:
            self._admitted = False
            self.limiter.release(self.pipeline)

    async def close(self) -> None:
        try:
            if self.stream is not None:
                await self.stream.aclose()
        finally:
            self._release()
            self.access["audio_s"] = round(self.audio_seconds, 3)
            self.access["outcome"] = self.access.get("outcome") or ("ok" if self._finished else "cancelled")
