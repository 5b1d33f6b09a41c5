"""Streaming a pipeline's entry model over gRPC with tritonclient (sync and asyncio)."""
from __future__ import annotations

import json
import queue
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterator

import numpy as np

from omni_backend.errors import error_code


class TritonStreamError(RuntimeError):
    """An error response from the server; `.code` is invalid_request / unavailable / internal."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = error_code(message)


@dataclass
class StreamResult:
    chunks: list[np.ndarray] = field(default_factory=list)
    sample_rate: int = 0
    ttfa_s: float = float("nan")
    total_s: float = 0.0

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)

    @property
    def audio_s(self) -> float:
        return sum(len(c) for c in self.chunks) / self.sample_rate if self.sample_rate else 0.0

    @property
    def rtf(self) -> float:
        return self.total_s / self.audio_s if self.audio_s else float("inf")


def _inputs(module, text: str, params: dict[str, Any] | None) -> list:
    t = module.InferInput("TEXT", [1], "BYTES")
    t.set_data_from_numpy(np.array([text.encode("utf-8")], dtype=np.object_))
    inputs = [t]
    if params:
        p = module.InferInput("PARAMS", [1], "BYTES")
        p.set_data_from_numpy(np.array([json.dumps(params).encode()], dtype=np.object_))
        inputs.append(p)
    return inputs


def _message(error: Any) -> str:
    msg = error.message() if hasattr(error, "message") else str(error)
    return msg() if callable(msg) else msg


def _parse(result: Any, error: Any) -> tuple[tuple[np.ndarray, int] | None, bool]:
    """One streamed response -> ((audio, sample rate) or None, is it the final one)."""
    if error is not None:
        raise TritonStreamError(_message(error))
    audio = result.as_numpy("AUDIO")
    chunk = None
    if audio is not None and audio.size:
        chunk = audio.reshape(-1), int(result.as_numpy("SAMPLE_RATE")[0])
    return chunk, result.get_response().parameters["triton_final_response"].bool_param


def stream(url: str, model: str, text: str, params: dict[str, Any] | None = None,
           timeout_s: float = 300.0) -> Iterator[tuple[np.ndarray, int]]:
    """Yield (audio chunk, sample rate) as they arrive; raises TritonStreamError."""
    import tritonclient.grpc as grpcclient

    responses: "queue.Queue" = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        client.async_stream_infer(model, _inputs(grpcclient, text, params),
                                  enable_empty_final_response=True)
        while True:
            chunk, final = _parse(*responses.get(timeout=timeout_s))
            if chunk is not None:
                yield chunk
            if final:
                return
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def synthesize(url: str, model: str, text: str, params: dict[str, Any] | None = None) -> StreamResult:
    """Stream a whole request, timing the first chunk."""
    res = StreamResult()
    t0 = time.perf_counter()
    for audio, rate in stream(url, model, text, params):
        if not res.chunks:
            res.ttfa_s = time.perf_counter() - t0
        res.chunks.append(audio)
        res.sample_rate = rate
    res.total_s = time.perf_counter() - t0
    return res


async def astream(client: Any, model: str, text: str, params: dict[str, Any] | None = None,
                  request_id: str = "") -> AsyncIterator[tuple[np.ndarray, int]]:
    """Async variant over a shared `tritonclient.grpc.aio.InferenceServerClient`.

    Closing the generator early (client gone) ends the gRPC stream, which cancels the request
    in Triton and, through the entry model, frees the engine slot.
    """
    import tritonclient.grpc.aio as aioclient

    async def requests():
        yield {"model_name": model, "inputs": _inputs(aioclient, text, params),
               "request_id": request_id, "enable_empty_final_response": True}

    responses = client.stream_infer(inputs_iterator=requests())
    try:
        async for result, error in responses:
            chunk, final = _parse(result, error)
            if chunk is not None:
                yield chunk
            if final:
                return
    finally:
        responses.cancel()
