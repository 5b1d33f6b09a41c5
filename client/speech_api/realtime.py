"""`WS /v1/realtime` (vLLM-Omni's, OpenAI-Realtime-like): a spoken turn in, a spoken answer out,
for a chat model that hears and speaks.

Client messages (JSON text frames):

- `session.update` (its fields at the top level or in `session`): `model` (a chat model; the
  default model when left out), and optionally `voice` (or `speaker`) and `instructions` (the
  system prompt); between turns it changes them. `input_audio_format` / `output_audio_format` may
  only be `pcm16`; `session.updated` names the fields it does not use (`ignored_fields`);
- `input_audio_buffer.append`: `audio`, base64 of PCM16 mono at 16 kHz (`sample_rate_hz` may name
  another rate), appended to the turn's recording (at most `MAX_TURN_S` seconds);
- `input_audio_buffer.commit`: `final: true` (or no `final`) ends the turn's recording and asks for
  the answer; `final: false` (vLLM-Omni's client sends it before its audio) only acknowledges;
- `input_audio_buffer.clear`: drops the recording so far; `session.close`.

Server messages: `session.created` / `session.updated`, `input_audio_buffer.committed`, then per
answer `transcription.delta` (`delta`: the answer's text as it is written), `response.audio.delta`
(`audio` and `delta`: base64 of PCM16 at `sample_rate_hz`), `transcription.done` (`text`,
`usage`), `response.audio.done`, and `error` (`message` with our stable code, `code`, `param`).

Each turn is one chat completion with the recording as an `input_audio` part, answered in text
and pcm16 (chat_completion.py): the same checks, admission, cancellation and audio as
`POST /v1/chat/completions`. Turns do not carry history; one answer runs at a time. A client that
disconnects cancels its answer (the Triton stream ends); the stream limits of the speech WebSocket
(config.StreamLimits) bound the session.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import io
import json
import logging
import uuid
from typing import Any

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from client.speech_api.chat_completion import ChatCompletion
from client.speech_api.chat_request import build_chat_params, parse_chat_body
from client.speech_api.errors import ApiError, from_triton, internal, invalid_request
from client.speech_api.speech_stream import served_pipeline
from client.speech_api.stream_config import error_message
from client.triton_stream import TritonStreamError

log = logging.getLogger("omni.speech_api")
INPUT_RATE = 16000        # what vLLM-Omni's client sends
MAX_TURN_S = 120.0        # a chat recording's limit
RATES = (8000, 48000)


def _wav(pcm: bytes, rate: int) -> bytes:
    import soundfile as sf

    buffer = io.BytesIO()
    sf.write(buffer, np.frombuffer(pcm, "<i2"), rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


class RealtimeSession:
    def __init__(self, ws: WebSocket, shim: Any):
        self.ws = ws
        self.shim = shim
        self.limits = shim.config.stream_limits
        self.session_id = f"rt-{uuid.uuid4().hex[:16]}"
        self.settings: dict[str, Any] = {}
        self.audio = bytearray()
        self.rate = INPUT_RATE
        self.turns = 0
        self.answer: asyncio.Task | None = None
        self._send_lock = asyncio.Lock()

    def resolve(self, model: str) -> str:
        """The chat pipeline behind `model`; 404 / 503 as the HTTP routes answer."""
        pipeline = served_pipeline(self.shim, model)
        info = self.shim.catalog.get(pipeline)
        if not info.chat or not info.speaks:
            raise invalid_request("model", f"model: '{model}' does not answer a spoken turn aloud (a chat model "
                                           "that speaks does)")
        return pipeline

    async def send(self, payload: dict) -> None:
        async with self._send_lock:
            await asyncio.wait_for(self.ws.send_text(json.dumps(payload)), self.limits.send_timeout_s)

    async def send_error(self, error: ApiError) -> None:
        await self.send({**error_message(error), "error": {"type": error.type, "code": error.code,
                                                           "param": error.param, "message": error.message}})

    async def run(self) -> None:
        await self.ws.accept()
        try:
            await self.send({"type": "session.created", "session": {"id": self.session_id}})
            await asyncio.wait_for(self._receive(), self.limits.max_session_s)
        except (WebSocketDisconnect, asyncio.TimeoutError, RuntimeError, OSError):
            pass   # gone, too slow, or over the session's length: nothing more to tell
        except Exception:  # noqa: BLE001 - a bug still ends the session with a coded error
            log.exception("realtime session %s failed", self.session_id)
            try:
                await self.send_error(internal("the session failed inside the server"))
            except Exception:  # noqa: BLE001
                pass
        finally:
            if self.answer is not None:
                self.answer.cancel()   # closes its Triton stream
                await asyncio.gather(self.answer, return_exceptions=True)
            try:
                await self.ws.close()
            except Exception:  # noqa: BLE001 - already closed
                pass

    async def _receive(self) -> None:
        while True:
            busy = self.answer is not None and not self.answer.done()
            try:
                message = await asyncio.wait_for(self.ws.receive(), None if busy else self.limits.idle_timeout_s)
            except asyncio.TimeoutError:
                await self.send_error(invalid_request("session", f"session: no message for "
                                                                 f"{self.limits.idle_timeout_s:g} s; closing"))
                return
            if message["type"] == "websocket.disconnect":
                return
            raw = message.get("text")
            if raw is None or len(raw) > self.limits.max_message_bytes:
                await self.send_error(invalid_request(None, "send JSON text messages (at most "
                                                            f"{self.limits.max_message_bytes} bytes)"))
                continue
            try:
                msg = json.loads(raw)
            except ValueError:
                msg = None
            if not isinstance(msg, dict):
                await self.send_error(invalid_request(None, "a message must be a JSON object with a type"))
                continue
            try:
                if await self._handle(msg) is False:
                    return
            except ApiError as e:
                await self.send_error(e)

    async def _handle(self, msg: dict) -> bool:
        kind = msg.get("type")
        if kind == "session.update":
            ignored = self._update(msg.get("session") if isinstance(msg.get("session"), dict) else msg)
            await self.send({"type": "session.updated", "session": {"id": self.session_id, **self.settings},
                             "ignored_fields": ignored})
        elif kind == "input_audio_buffer.append":
            self._append(msg)
        elif kind == "input_audio_buffer.clear":
            self.audio.clear()
            await self.send({"type": "input_audio_buffer.cleared"})
        elif kind == "input_audio_buffer.commit":
            final = msg.get("final", True)
            if not isinstance(final, bool):
                raise invalid_request("final", "final: must be true or false")
            await self.send({"type": "input_audio_buffer.committed", "final": final,
                             "audio_seconds": round(len(self.audio) / 2 / self.rate, 3)})
            if final:
                self._respond()
        elif kind == "session.close":
            if self.answer is not None:
                await asyncio.gather(self.answer, return_exceptions=True)
            return False
        else:
            raise invalid_request("type", f"type: unknown message type {kind!r}")
        return True

    def _update(self, fields: dict) -> list[str]:
        """The session's settings from a session.update; returns the fields it does not use (an
        OpenAI Realtime client's turn detection, say), which session.updated names."""
        if self.answer is not None and not self.answer.done():
            raise invalid_request("session.update", "session.update: not while an answer is being made")
        for name in ("input_audio_format", "output_audio_format"):   # audio is PCM16 both ways
            if fields.get(name) not in (None, "pcm16"):
                raise invalid_request(name, f"{name}: only pcm16")
        settings = dict(self.settings)
        for name in ("model", "voice", "speaker", "instructions"):
            if name in fields:
                value = fields[name]
                if value is not None and (not isinstance(value, str) or not value.strip()):
                    raise invalid_request(name, f"{name}: must be a non-empty string")
                settings["voice" if name == "speaker" else name] = value
        if settings.get("model") is not None:
            self.resolve(settings["model"])   # a model not served: refused now
        self.settings = {k: v for k, v in settings.items() if v is not None}
        used = ("type", "model", "voice", "speaker", "instructions", "input_audio_format", "output_audio_format")
        return sorted(k for k in fields if k not in used)

    def _append(self, msg: dict) -> None:
        rate = msg.get("sample_rate_hz", self.rate if self.audio else INPUT_RATE)
        if isinstance(rate, bool) or not isinstance(rate, int) or not RATES[0] <= rate <= RATES[1]:
            raise invalid_request("sample_rate_hz", f"sample_rate_hz: an integer in [{RATES[0]}, {RATES[1]}]")
        if self.audio and rate != self.rate:
            raise invalid_request("sample_rate_hz", "sample_rate_hz: one rate per turn")
        data = msg.get("audio")
        try:
            pcm = base64.b64decode(data, validate=True) if isinstance(data, str) else None
        except (binascii.Error, ValueError):
            pcm = None
        if pcm is None or len(pcm) % 2:
            raise invalid_request("audio", "audio: base64 of PCM16 mono samples")
        if (len(self.audio) + len(pcm)) / 2 / rate > MAX_TURN_S:
            raise invalid_request("audio", f"audio: the turn would be longer than {MAX_TURN_S:g} s")
        self.rate = rate
        self.audio += pcm

    def _respond(self) -> None:
        if self.answer is not None and not self.answer.done():
            raise invalid_request("input_audio_buffer.commit", "input_audio_buffer.commit: an answer is being "
                                                               "made; wait for response.audio.done")
        if not self.audio:
            raise invalid_request("audio", "audio: nothing recorded for this turn")
        content = [{"type": "input_audio", "input_audio": {"data": base64.b64encode(_wav(bytes(self.audio), self.rate))
                                                           .decode("ascii"), "format": "wav"}}]
        messages = ([{"role": "system", "content": self.settings["instructions"]}]
                    if self.settings.get("instructions") else []) + [{"role": "user", "content": content}]
        model = self.settings.get("model") or self.shim.catalog.default_model()
        body = {"model": model, "messages": messages, "modalities": ["text", "audio"],
                "audio": {"voice": self.settings.get("voice", "alloy"), "format": "pcm16"}}
        self.audio = bytearray()
        self.turns += 1
        self.answer = asyncio.ensure_future(self._answer(body, f"{self.session_id}-{self.turns}"))

    async def _answer(self, body: dict, request_id: str) -> None:
        completion = None
        try:
            if body["model"] is None:
                raise invalid_request("model", "model: name a chat model in session.update")
            pipeline = self.resolve(body["model"])
            info = self.shim.catalog.get(pipeline)
            chat = parse_chat_body(body, self.shim.chat_audio)
            triton = build_chat_params(chat, info)
            completion = ChatCompletion(self.shim.pool, self.shim.limiter, chat, triton, body["model"], request_id,
                                        {"model": pipeline, "stream": "realtime"}, self.shim.chat_audio)
            await completion.start()
            pending = b""
            async for kind, value in completion.parts():
                if kind == "text":
                    await self.send({"type": "transcription.delta", "delta": value})
                    continue
                pending += value
                whole = len(pending) - len(pending) % 2
                if whole:
                    data = base64.b64encode(pending[:whole]).decode("ascii")
                    pending = pending[whole:]
                    await self.send({"type": "response.audio.delta", "audio": data, "delta": data,
                                     "sample_rate_hz": completion.sample_rate})
            await self.send({"type": "transcription.done", "text": "".join(completion.transcript),
                             "usage": completion.usage()})
            await self.send({"type": "response.audio.done", "finish_reason": completion.finish_reason})
        except (TritonStreamError, ApiError) as e:
            error = from_triton(str(e)) if isinstance(e, TritonStreamError) else e
            try:
                await self.send_error(error)
            except Exception:  # noqa: BLE001 - the client is gone: nobody to tell
                pass
        except (WebSocketDisconnect, asyncio.TimeoutError, RuntimeError, OSError):
            pass   # the client is gone or takes nothing; the session's reader ends it
        except Exception:  # noqa: BLE001 - a bug: this answer fails, coded, the session goes on
            log.exception("realtime answer %s failed", request_id)
            try:
                await self.send_error(internal("this answer failed inside the server"))
            except Exception:  # noqa: BLE001
                pass
        finally:
            if completion is not None:
                await completion.close()
