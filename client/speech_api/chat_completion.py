"""One chat completion: a chat pipeline's Triton stream (text deltas interleaved with audio) ->
OpenAI's `chat.completion` object, or its `chat.completion.chunk` SSE stream.

`start()` runs before the HTTP status line: it takes a stream slot, opens the Triton stream and
waits for its first response, so bad input (even input only the pipeline can judge), overload and
dead servers are real HTTP errors. Then:

- streaming: a chunk with `delta.role`, then the text as it is written (`delta.content`, or with
  audio `delta.audio.transcript`, as OpenAI sends it) and the audio as it is made
  (`delta.audio.data`: base64 of the requested format's bytes, cut at multiples of 6 bytes so
  every piece decodes alone and pieces concatenated as strings stay valid base64), then a chunk
  with `finish_reason`, a usage chunk when `stream_options.include_usage`, and `data: [DONE]`.
  A failure after the status line is a `data: {"error": {...}}` event, and the stream ends.
- not streaming: the whole answer; with audio, OpenAI's shape: `message.content` null and
  `message.audio` {id, data (the whole file, base64), expires_at, transcript}.

Closing the body (the client hung up) closes the Triton stream, which cancels the request in
Triton and frees its stages.
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import struct
import time
import uuid
from typing import Any, AsyncIterator

import numpy as np

from client.speech_api import sse
from client.speech_api.admission import StreamLimiter
from client.speech_api.admitted_stream import AdmittedStream
from client.speech_api.chat_request import AudioTranscripts, ChatRequest, ChatTritonRequest, chat_error
from client.speech_api.encoders import make_encoder
from client.speech_api.encoders.wav import UNKNOWN_SIZE
from client.speech_api.errors import ApiError, internal
from client.speech_api.pool import TritonPool
from client.triton_stream import StreamPart

log = logging.getLogger("omni.speech_api")
TEXT_OUTPUT = "TEXT_DELTA"
# A chat pipeline's last text response may say why the answer ended: "stop" or "length" (max_tokens).
FINISH_OUTPUT = "FINISH_REASON"
FINISH_REASONS = ("stop", "length")
# base64 of n bytes concatenates cleanly only when n is a multiple of 3; pcm16 samples are 2 bytes
PIECE_BYTES = 6


def sized_wav(data: bytes) -> bytes:
    """A whole file from the streaming WAV encoder, with its RIFF and data sizes filled in (the
    stream's header says 'unknown' because it goes out before the audio exists)."""
    if len(data) < 44 or data[:4] != b"RIFF" or data[36:40] != b"data":
        return data
    if struct.unpack_from("<I", data, 4)[0] != UNKNOWN_SIZE:
        return data
    out = bytearray(data)
    struct.pack_into("<I", out, 4, len(data) - 8)
    struct.pack_into("<I", out, 40, len(data) - 44)
    return bytes(out)


def _text(tensor: np.ndarray) -> str:
    """A BYTES output tensor's UTF-8 text."""
    return b"".join(bytes(x) for x in tensor.reshape(-1)).decode("utf-8", errors="replace")


def sized_flac(data: bytes, samples: int) -> bytes:
    """A whole FLAC file from the streaming encoder, with STREAMINFO's total sample count (36 bits
    from bit 108 of the block) filled in: readers that trust a 0 ("unknown") fail on a file."""
    if len(data) < 42 or data[:4] != b"fLaC" or data[4] & 0x7F != 0 or not 0 < samples < 2**36:
        return data
    out = bytearray(data)
    at = 8 + 13
    out[at] = (out[at] & 0xF0) | (samples >> 32)
    struct.pack_into(">I", out, at + 1, samples & 0xFFFFFFFF)
    return bytes(out)


class ChatCompletion(AdmittedStream):
    def __init__(self, pool: TritonPool, limiter: StreamLimiter, request: ChatRequest,
                 triton: ChatTritonRequest, model: str, request_id: str, access: dict[str, Any],
                 transcripts: AudioTranscripts | None = None):
        super().__init__(pool, limiter, triton.pipeline, request_id, access)
        self.request = request
        self.triton = triton
        self.model = model
        self.transcripts = transcripts
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.audio_id = f"audio_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.transcript: list[str] = []
        self.finish_reason = "stop"
        self._encoder = None

    # ------------------------------------------------------------------ the Triton stream

    async def start(self) -> None:
        await self.open(self.triton.text, self.triton.params, parts=True,
                        refine=lambda e: chat_error(e, self.triton))

    async def parts(self) -> AsyncIterator[tuple[str, Any]]:
        """("text", str) and ("audio", encoded bytes) in arrival order; the encoder's tail last."""
        assert self.stream is not None
        loop = asyncio.get_running_loop()
        try:
            async for part in self.stream.chunks():
                assert isinstance(part, StreamPart)
                delta = part.outputs.get(TEXT_OUTPUT)
                if delta is not None:
                    text = _text(delta)
                    if text:
                        self.transcript.append(text)
                        yield "text", text
                finish = part.outputs.get(FINISH_OUTPUT)
                if finish is not None and _text(finish) in FINISH_REASONS:
                    self.finish_reason = _text(finish)
                if part.audio is not None and self.request.audio:
                    if self._encoder is None:
                        await loop.run_in_executor(None, self._open_encoder, part.sample_rate)
                    data = await loop.run_in_executor(None, self._encode, part.audio)
                    if data:
                        yield "audio", data
        except ApiError as e:
            raise chat_error(e, self.triton) from None
        if self.request.audio:
            if self._encoder is None:   # no audio at all: an empty but well-formed file
                await loop.run_in_executor(None, self._open_encoder, 24000)
            data = await loop.run_in_executor(None, self._encoder.finish)
            if data:
                yield "audio", data
        self._finished = True

    def _open_encoder(self, rate: int) -> None:
        self.sample_rate = rate
        self._encoder = make_encoder(self.request.encoder_format, rate)

    def _encode(self, audio: np.ndarray) -> bytes:
        self.audio_samples += audio.size
        return self._encoder.encode(audio)

    # ------------------------------------------------------------------ OpenAI's objects

    def usage(self) -> dict[str, Any]:
        """Estimated like the speech route's: text tokens are words and punctuation marks, audio
        tokens 12.5 per second (the pipeline does not report its own token counts)."""
        counts = sse.usage(self.request.prompt_text(), 0.0)
        prompt = counts["input_tokens"]
        answer = sse.usage("".join(self.transcript), self.audio_seconds)
        text, audio = answer["input_tokens"], answer["output_tokens"]
        return {"prompt_tokens": prompt, "completion_tokens": text + audio, "total_tokens": prompt + text + audio,
                "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": audio,
                                              "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}

    def _chunk(self, delta: dict[str, Any] | None, finish_reason: str | None = None, **extra) -> bytes:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None,
                                             "finish_reason": finish_reason}]
        payload = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                   "system_fingerprint": None, "choices": choices}
        # vLLM-Omni's clients and benchmark sort chunks by a top-level `modality`: text deltas
        # and audio data (OpenAI's shape otherwise; a transcript delta is neither)
        if delta and delta.get("content"):
            payload["modality"] = "text"
        elif delta and (delta.get("audio") or {}).get("data"):
            payload["modality"] = "audio"
        if self.request.include_usage:
            payload["usage"] = None
        payload.update(extra)
        return sse.event(payload)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The SSE body; ends the Triton stream however it ends."""
        try:
            async for data in self._chunks():
                yield data
        finally:
            await self.close()

    async def _chunks(self) -> AsyncIterator[bytes]:
        audio = self.request.audio
        yield self._chunk({"role": "assistant", "content": None if audio else "", "refusal": None})
        first_audio_delta = True
        pending = b""

        def audio_delta(**fields) -> dict[str, Any]:
            nonlocal first_audio_delta
            if first_audio_delta:   # OpenAI names the audio once, in its first delta
                fields = {"id": self.audio_id, **fields}
                first_audio_delta = False
            return {"audio": fields}

        try:
            async for kind, value in self.parts():
                if kind == "text":
                    yield self._chunk(audio_delta(transcript=value) if audio else {"content": value})
                    continue
                pending += value
                cut = len(pending) - len(pending) % PIECE_BYTES
                if cut:
                    yield self._chunk(audio_delta(data=base64.b64encode(pending[:cut]).decode()))
                    pending = pending[cut:]
            if pending:
                yield self._chunk(audio_delta(data=base64.b64encode(pending).decode()))
        except ApiError as e:
            self.access["outcome"] = f"error {e.status}"
            yield sse.event(e.envelope())
            return
        except Exception as e:  # noqa: BLE001 - the client gets an error event, not a cut stream
            log.exception("request %s failed mid-stream", self.request_id)
            self.access["outcome"] = "error 500"
            yield sse.event(internal(f"{type(e).__name__}: {e}").envelope())
            return
        if audio:
            expires_at = self._remember()
            yield self._chunk(audio_delta(expires_at=expires_at))
        yield self._chunk({}, self.finish_reason)
        if self.request.include_usage:
            yield self._chunk(None, usage=self.usage())
        yield b"data: [DONE]\n\n"

    def _remember(self) -> int:
        text = "".join(self.transcript)
        if self.transcripts is not None:
            return self.transcripts.remember(self.audio_id, text)
        return int(time.time())

    async def complete(self) -> dict[str, Any]:
        """The whole `chat.completion` object (not streaming); ends the Triton stream."""
        audio = bytearray()
        try:
            async for kind, value in self.parts():
                if kind == "audio":
                    audio += value
        finally:
            await self.close()
        text = "".join(self.transcript)
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None, "annotations": []}
        if self.request.audio:
            data = bytes(audio)
            if self.request.audio_format == "wav":
                data = sized_wav(data)
            elif self.request.audio_format == "flac":
                data = sized_flac(data, self.audio_samples)
            message["content"] = None
            message["audio"] = {"id": self.audio_id, "data": base64.b64encode(data).decode(),
                                "expires_at": self._remember(), "transcript": text}
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "system_fingerprint": None,
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": self.finish_reason}],
                "usage": self.usage(), "service_tier": "default"}

    @staticmethod
    def json_body(completion: dict[str, Any]) -> bytes:
        return json.dumps(completion, ensure_ascii=True, separators=(",", ":")).encode()
