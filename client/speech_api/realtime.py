"""`WS /v1/realtime`: a spoken conversation with a chat model that hears and speaks, in two
dialects on one route.

vLLM-Omni's (a client that connects without `?model=`): each turn is the recording committed with
`final: true` (or, when audio was appended, a commit without `final`), answered at once without
history:

- `session.update` (its fields at the top level or in `session`): `model` (a chat model; the
  default model when left out), and optionally `voice` (or `speaker`) and `instructions` (the
  system prompt); between turns it changes them. `input_audio_format` / `output_audio_format` may
  only be `pcm16`; `session.updated` names the fields it does not use (`ignored_fields`);
- `input_audio_buffer.append`: `audio`, base64 of PCM16 mono at 16 kHz (`sample_rate_hz` may name
  another rate), appended to the turn's recording (at most `MAX_TURN_S` seconds);
- `input_audio_buffer.commit`: `final: true` ends the turn's recording and asks for the answer;
  `final: false`, or a commit before any audio (vLLM-Omni's clients send one first), only
  acknowledges; `input_audio_buffer.clear`; `session.close`.
- Server: `session.created` / `session.updated`, `input_audio_buffer.committed`, then per answer
  `transcription.delta` (the answer's text as it is written), `response.audio.delta` (`audio` and
  `delta`: base64 of PCM16 at `sample_rate_hz`), `transcription.done` (`text`, `usage`),
  `response.audio.done`, and `error` (`message` with our stable code, `code`, `param`).

OpenAI's Realtime API (a client that connects with `?model=`, as the `openai` SDK's
`client.realtime.connect` does; with `OpenAI-Beta: realtime=v1` the beta's event names): a
conversation of items, answered on `response.create`, with the whole conversation as history:

- `session.update` `{"session": {...}}`: `model`, `instructions`, `output_modalities` (beta:
  `modalities`; `["audio"]` or `["text"]`), the voice (`audio.output.voice`; beta: `voice`); audio
  formats only PCM16 at 24 kHz (`{"type": "audio/pcm", "rate": 24000}`; beta: `pcm16`);
  `turn_detection` only null: the server detects no turns, the client commits them;
- `input_audio_buffer.append` (PCM16 at 24 kHz), `.commit` (the buffer becomes a user item:
  `input_audio_buffer.committed` with its `item_id`), `.clear`; `conversation.item.create` (a
  `message` item: user `input_text` / `input_audio` (base64 PCM16) / `input_image` parts, system
  `input_text`, assistant `output_text` / `output_audio` transcripts), `conversation.item.delete`;
  `response.create` (`instructions`, `output_modalities`, the voice, `max_output_tokens` for this
  response), `response.cancel`.
- Server: `session.created` / `.updated` (the session as the API describes it), item echoes, and
  per response `response.created`, `response.output_item.added`, `response.content_part.added`,
  `response.output_audio_transcript.delta` + `response.output_audio.delta` (or
  `response.output_text.delta`), their `.done`s, `response.content_part.done`,
  `response.output_item.done`, `response.done` (`status` completed, cancelled or incomplete;
  `usage`); every event with an `event_id`.

Each answer is one chat completion (chat_completion.py): the same checks, admission,
cancellation and audio as `POST /v1/chat/completions`; one answer at a time. A client that
disconnects cancels its answer (the Triton stream ends); the stream limits of the speech
WebSocket (config.StreamLimits) bound the session.
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
from client.speech_api.realtime_events import ResponseEvents, item_echo, new_id, usage
from client.speech_api.speech_stream import served_pipeline
from client.speech_api.stream_config import error_message
from client.triton_stream import TritonStreamError

log = logging.getLogger("omni.speech_api")
INPUT_RATE = 16000        # what vLLM-Omni's client sends
OPENAI_RATE = 24000       # OpenAI's PCM16, both ways
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
        # OpenAI's dialect: its SDK names the model in the URL (module doc)
        self.openai = "model" in ws.query_params or "openai-beta" in ws.headers
        self.beta = "realtime=v1" in ws.headers.get("openai-beta", "")
        self.settings: dict[str, Any] = {}
        if ws.query_params.get("model"):
            self.settings["model"] = ws.query_params["model"]
        self.audio_out = True
        self.input_rate = OPENAI_RATE if self.openai else INPUT_RATE
        self.audio = bytearray()
        self.rate = self.input_rate
        self.items: list[dict[str, Any]] = []   # the conversation: {"id", "message" (chat form)}
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
        if self.openai and "event_id" not in payload:
            payload = {"event_id": new_id("event"), **payload}
        async with self._send_lock:
            await asyncio.wait_for(self.ws.send_text(json.dumps(payload)), self.limits.send_timeout_s)

    async def send_error(self, error: ApiError) -> None:
        await self.send({**error_message(error), "error": {"type": error.type, "code": error.code,
                                                           "param": error.param, "message": error.message}})

    def describe(self) -> dict[str, Any]:
        """The session as the dialect describes it."""
        if not self.openai:
            return {"id": self.session_id, **self.settings}
        voice = self.settings.get("voice", "alloy")
        common = {"id": self.session_id, "object": "realtime.session", "model": self.settings.get("model"),
                  "instructions": self.settings.get("instructions", "")}
        if self.beta:
            return {**common, "modalities": ["audio", "text"] if self.audio_out else ["text"], "voice": voice,
                    "input_audio_format": "pcm16", "output_audio_format": "pcm16", "turn_detection": None}
        pcm = {"type": "audio/pcm", "rate": OPENAI_RATE}
        return {**common, "type": "realtime", "output_modalities": ["audio"] if self.audio_out else ["text"],
                "audio": {"input": {"format": pcm, "turn_detection": None},
                          "output": {"format": pcm, "voice": voice}}}

    async def run(self) -> None:
        await self.ws.accept()
        try:
            if self.settings.get("model") is not None:
                self.resolve(self.settings["model"])
            # `id` at the top too: an older vLLM-Omni client reads it there
            await self.send({"type": "session.created", "session": self.describe(),
                             **({} if self.openai else {"id": self.session_id})})
            await asyncio.wait_for(self._receive(), self.limits.max_session_s)
        except ApiError as e:   # a model in the URL that is not served
            try:
                await self.send_error(e)
            except Exception:  # noqa: BLE001
                pass
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
        if kind == "session.update":   # the fields in `session`, or beside `type` (vLLM-Omni's)
            nested = isinstance(msg.get("session"), dict)
            fields = msg["session"] if nested else {k: v for k, v in msg.items() if k not in ("type", "event_id")}
            ignored = self._update(fields)
            await self.send({"type": "session.updated", "session": self.describe(), "ignored_fields": ignored})
        elif kind == "input_audio_buffer.append":
            self._append(msg)
        elif kind == "input_audio_buffer.clear":
            self.audio.clear()
            await self.send({"type": "input_audio_buffer.cleared"})
        elif kind == "input_audio_buffer.commit":
            await self._commit(msg)
        elif kind == "conversation.item.create" and self.openai:
            await self._create_item(msg)
        elif kind == "conversation.item.delete" and self.openai:
            await self._delete_item(msg)
        elif kind == "response.create":
            self._start(self._respond(msg.get("response") or {}))
        elif kind == "response.cancel":
            if self.answer is None or self.answer.done():
                raise invalid_request("response", "response: none is being made", code="response_cancel_not_active")
            self.answer.cancel()
            await asyncio.gather(self.answer, return_exceptions=True)
        elif kind == "session.close":
            if self.answer is not None:
                await asyncio.gather(self.answer, return_exceptions=True)
            return False
        else:
            raise invalid_request("type", f"type: unknown message type {kind!r}")
        return True

    def _update(self, fields: dict) -> list[str]:
        """The session's settings from a session.update (either dialect); returns the fields it
        does not use, which session.updated names."""
        if self.answer is not None and not self.answer.done():
            raise invalid_request("session.update", "session.update: not while an answer is being made")
        ignored = []
        for name in ("input_audio_format", "output_audio_format"):   # audio is PCM16 both ways
            if fields.get(name) not in (None, "pcm16"):
                raise invalid_request(name, f"{name}: only pcm16")
        if fields.get("type") not in (None, "realtime"):
            raise invalid_request("session.type", "session.type: only realtime (a conversation)")
        _no_turn_detection(fields.get("turn_detection"), "turn_detection")
        settings = dict(self.settings)
        audio = fields.get("audio")
        if audio is not None:
            settings.update(_audio_settings(audio, ignored))
        for name in ("model", "voice", "speaker", "instructions"):
            if name in fields:
                value = fields[name]
                if value is not None and (not isinstance(value, str) or not value.strip()):
                    raise invalid_request(name, f"{name}: must be a non-empty string")
                settings["voice" if name == "speaker" else name] = value
        modalities = _modalities(fields)
        if settings.get("model") is not None:
            self.resolve(settings["model"])   # a model not served: refused now
        self.settings = {k: v for k, v in settings.items() if v is not None}
        if modalities is not None:
            self.audio_out = modalities
        used = ("type", "model", "voice", "speaker", "instructions", "input_audio_format", "output_audio_format",
                "turn_detection", "audio", "modalities", "output_modalities")
        return sorted(ignored + [k for k in fields if k not in used])

    def _append(self, msg: dict) -> None:
        rate = msg.get("sample_rate_hz", self.rate if self.audio else self.input_rate)
        if isinstance(rate, bool) or not isinstance(rate, int) or not RATES[0] <= rate <= RATES[1]:
            raise invalid_request("sample_rate_hz", f"sample_rate_hz: an integer in [{RATES[0]}, {RATES[1]}]")
        if self.audio and rate != self.rate:
            raise invalid_request("sample_rate_hz", "sample_rate_hz: one rate per turn")
        pcm = _pcm(msg.get("audio"), "audio")
        if (len(self.audio) + len(pcm)) / 2 / rate > MAX_TURN_S:
            raise invalid_request("audio", f"audio: the turn would be longer than {MAX_TURN_S:g} s")
        self.rate = rate
        self.audio += pcm

    async def _commit(self, msg: dict) -> None:
        final = msg.get("final")
        if final is not None and not isinstance(final, bool):
            raise invalid_request("final", "final: must be true or false")
        if self.openai:
            if not self.audio:
                raise invalid_request("input_audio_buffer", "input_audio_buffer: nothing to commit (append audio "
                                                            "first)", code="input_audio_buffer_commit_empty")
            previous = self.items[-1]["id"] if self.items else None
            item = self._add_item("user", [_recording_part(bytes(self.audio), self.rate)],
                                  [{"type": "input_audio", "transcript": None}])
            self.audio = bytearray()
            await self.send({"type": "input_audio_buffer.committed", "previous_item_id": previous,
                             "item_id": item["id"]})
            for event in item_echo(item["item"], previous, self.beta):
                await self.send(event)
            if final:
                self._start(self._respond({}))
            return
        seconds = round(len(self.audio) / 2 / self.rate, 3)
        # vLLM-Omni's clients commit once before their audio (without `final`, or `final: false`)
        answers = bool(final) or (final is None and bool(self.audio))
        await self.send({"type": "input_audio_buffer.committed", "final": answers, "audio_seconds": seconds})
        if answers:
            if not self.audio:
                raise invalid_request("audio", "audio: nothing recorded for this turn")
            recording = _recording_part(bytes(self.audio), self.rate)
            self.audio = bytearray()
            self.turns += 1
            self._start(self._answer_turn(recording, f"{self.session_id}-{self.turns}"))

    def _add_item(self, role: str, content: list[dict] | str, shown: list[dict],
                  after: str | None = None) -> dict[str, Any]:
        item = {"id": new_id("item"), "object": "realtime.item", "type": "message", "role": role,
                "status": "completed", "content": shown}
        entry = {"id": item["id"], "message": {"role": role, "content": content}, "item": item}
        if after is None:
            index = len(self.items)
        else:
            index = 0 if after == "root" else next(i for i, e in enumerate(self.items) if e["id"] == after) + 1
        self.items.insert(index, entry)
        return entry

    async def _create_item(self, msg: dict) -> None:
        item = msg.get("item")
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            raise invalid_request("item.type", "item.type: only message items (no function calls here)")
        role = item.get("role")
        if role not in ("user", "system", "assistant"):
            raise invalid_request("item.role", "item.role: user, system or assistant")
        parts = item.get("content")
        if not isinstance(parts, list) or not parts:
            raise invalid_request("item.content", "item.content: a non-empty list of content parts")
        after = msg.get("previous_item_id")
        if after is not None and after != "root" and not any(e["id"] == after for e in self.items):
            raise invalid_request("previous_item_id", f"previous_item_id: no item {after!r} in the conversation")
        content, shown = _item_content(role, parts, self.input_rate)
        entry = self._add_item(role, content, shown, after)
        index = self.items.index(entry)
        previous = self.items[index - 1]["id"] if index else None
        for event in item_echo(entry["item"], previous, self.beta):
            await self.send(event)

    async def _delete_item(self, msg: dict) -> None:
        item_id = msg.get("item_id")
        index = next((i for i, e in enumerate(self.items) if e["id"] == item_id), None)
        if index is None:
            raise invalid_request("item_id", f"item_id: no item {item_id!r} in the conversation")
        del self.items[index]
        await self.send({"type": "conversation.item.deleted", "item_id": item_id})

    def _start(self, answer) -> None:
        if self.answer is not None and not self.answer.done():
            answer.close()
            raise invalid_request("response", "response: an answer is being made; wait for it to finish (or "
                                              "cancel it)", code="conversation_already_has_active_response")
        self.answer = asyncio.ensure_future(answer)

    def _chat_body(self, messages: list[dict], audio: bool, voice: str | None = None,
                   instructions: str | None = None) -> dict[str, Any]:
        instructions = instructions if instructions is not None else self.settings.get("instructions")
        model = self.settings.get("model") or self.shim.catalog.default_model()
        body: dict[str, Any] = {"model": model, "messages": ([{"role": "system", "content": instructions}]
                                                             if instructions else []) + messages,
                                "modalities": ["text", "audio"] if audio else ["text"]}
        if audio:
            body["audio"] = {"voice": voice or self.settings.get("voice", "alloy"), "format": "pcm16"}
        return body

    async def _completion(self, body: dict, request_id: str) -> ChatCompletion:
        if body["model"] is None:
            raise invalid_request("model", "model: name a chat model in session.update")
        pipeline = self.resolve(body["model"])
        info = self.shim.catalog.get(pipeline)
        chat = parse_chat_body(body, self.shim.chat_audio)
        triton = build_chat_params(chat, info)
        return ChatCompletion(self.shim.pool, self.shim.limiter, chat, triton, body["model"], request_id,
                              {"model": pipeline, "stream": "realtime"}, self.shim.chat_audio)

    async def _answer_turn(self, recording: dict, request_id: str) -> None:
        """vLLM-Omni's dialect: one recording answered, its text as transcription.* events."""
        completion = None
        try:
            body = self._chat_body([{"role": "user", "content": [recording]}], audio=True)
            completion = await self._completion(body, request_id)
            await completion.start()
            async for kind, value in _answer_parts(completion):
                if kind == "text":
                    await self.send({"type": "transcription.delta", "delta": value})
                else:
                    await self.send({"type": "response.audio.delta", "audio": value, "delta": value,
                                     "sample_rate_hz": completion.sample_rate})
            await self.send({"type": "transcription.done", "text": "".join(completion.transcript),
                             "usage": completion.usage()})
            await self.send({"type": "response.audio.done", "finish_reason": completion.finish_reason})
        except Exception as e:  # noqa: BLE001 - told to the client; the session goes on
            await self._failed(e, request_id)
        finally:
            if completion is not None:
                await completion.close()

    async def _respond(self, overrides: Any) -> None:
        """OpenAI's dialect: the conversation answered as one response (module doc)."""
        completion = None
        events = None
        self.turns += 1
        request_id = f"{self.session_id}-{self.turns}"
        try:
            audio, voice, instructions, max_tokens = _response_settings(overrides, self.audio_out)
            body = self._chat_body([e["message"] for e in self.items], audio, voice, instructions)
            if max_tokens is not None:
                body["max_tokens"] = max_tokens
            completion = await self._completion(body, request_id)
            await completion.start()   # bad input is an error before response.created
            events = ResponseEvents(beta=self.beta, audio=audio)
            for event in events.started():
                await self.send(event)
            async for kind, value in _answer_parts(completion):
                await self.send(events.text_delta(value) if kind == "text" else events.audio_delta(value))
            text = "".join(completion.transcript)
            self.items.append({"id": events.item_id, "message": {"role": "assistant", "content": text},
                               "item": events.item("completed", text)})
            length = completion.finish_reason == "length"
            for event in events.finished(text, usage(completion.usage()), "incomplete" if length else "completed",
                                         "max_output_tokens" if length else None):
                await self.send(event)
        except asyncio.CancelledError:
            if events is not None:   # response.cancel, or the session ends
                text = "".join(completion.transcript) if completion is not None else ""
                try:
                    for event in events.finished(text, usage(completion.usage()), "cancelled", "client_cancelled"):
                        await self.send(event)
                except Exception:  # noqa: BLE001 - the client is gone
                    pass
        except Exception as e:  # noqa: BLE001 - told to the client; the session goes on
            await self._failed(e, request_id, events)
        finally:
            if completion is not None:
                await completion.close()

    async def _failed(self, error: Exception, request_id: str, events: ResponseEvents | None = None) -> None:
        if isinstance(error, (WebSocketDisconnect, asyncio.TimeoutError, RuntimeError, OSError)):
            return   # the client is gone or takes nothing; the session's reader ends it
        if isinstance(error, TritonStreamError):
            error = from_triton(str(error))
        elif not isinstance(error, ApiError):
            log.error("realtime answer %s failed", request_id, exc_info=error)
            error = internal("this answer failed inside the server")
        try:
            await self.send_error(error)
            if events is not None:
                await self.send(events.failed({"type": error.type, "code": error.code, "message": error.message}))
        except Exception:  # noqa: BLE001 - the client is gone: nobody to tell
            pass


async def _answer_parts(completion: ChatCompletion):
    """A completion's parts: ("text", delta), or ("audio", base64 of whole PCM16 samples; an odd
    byte waits for the next piece)."""
    pending = b""
    async for kind, value in completion.parts():
        if kind == "text":
            yield kind, value
            continue
        pending += value
        whole = len(pending) - len(pending) % 2
        if whole:
            yield "audio", base64.b64encode(pending[:whole]).decode("ascii")
            pending = pending[whole:]


def _pcm(data: Any, field: str) -> bytes:
    try:
        pcm = base64.b64decode(data, validate=True) if isinstance(data, str) else None
    except (binascii.Error, ValueError):
        pcm = None
    if pcm is None or len(pcm) % 2:
        raise invalid_request(field, f"{field}: base64 of PCM16 mono samples")
    return pcm


def _recording_part(pcm: bytes, rate: int) -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(_wav(pcm, rate)).decode("ascii"),
                                                   "format": "wav"}}


def _no_turn_detection(value: Any, field: str) -> None:
    if value is not None:
        raise invalid_request(field, f"{field}: this server detects no turns; set it to null, then send "
                                     "input_audio_buffer.commit and response.create for each turn")


def _audio_settings(audio: Any, ignored: list[str]) -> dict[str, Any]:
    """The GA session's `audio` object: PCM16 at 24 kHz both ways, no turn detection, the voice."""
    if not isinstance(audio, dict):
        raise invalid_request("audio", "audio: an object with input and output")
    out: dict[str, Any] = {}
    for side in ("input", "output"):
        spec = audio.get(side) or {}
        if not isinstance(spec, dict):
            raise invalid_request(f"audio.{side}", f"audio.{side}: an object")
        fmt = spec.get("format")
        if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "audio/pcm"
                                or fmt.get("rate", OPENAI_RATE) != OPENAI_RATE):
            raise invalid_request(f"audio.{side}.format", f"audio.{side}.format: only "
                                                          f'{{"type": "audio/pcm", "rate": {OPENAI_RATE}}}')
        if side == "input":
            _no_turn_detection(spec.get("turn_detection"), "audio.input.turn_detection")
            ignored += [f"audio.input.{k}" for k in spec if k not in ("format", "turn_detection")]
        else:
            if "voice" in spec:
                out["voice"] = spec["voice"]
            ignored += [f"audio.output.{k}" for k in spec if k not in ("format", "voice")]
    return out


def _modalities(fields: dict) -> bool | None:
    """Whether answers are spoken, from `output_modalities` or the beta's `modalities`."""
    value = fields.get("output_modalities", fields.get("modalities"))
    if value is None:
        return None
    if not isinstance(value, list) or not value or any(v not in ("text", "audio") for v in value):
        raise invalid_request("output_modalities", 'output_modalities: ["audio"] or ["text"]')
    return "audio" in value


def _response_settings(overrides: Any, audio_out: bool) -> tuple[bool, str | None, str | None, int | None]:
    """A response.create's own settings: (spoken, voice, instructions, max tokens)."""
    if not isinstance(overrides, dict):
        raise invalid_request("response", "response: an object")
    known = ("instructions", "output_modalities", "modalities", "voice", "audio", "max_output_tokens",
             "max_response_output_tokens", "metadata", "conversation")
    unknown = sorted(k for k in overrides if k not in known)
    if unknown:
        raise invalid_request(f"response.{unknown[0]}", f"response.{unknown[0]}: not supported here")
    if overrides.get("conversation") not in (None, "auto"):
        raise invalid_request("response.conversation", "response.conversation: only auto (the session's "
                                                       "conversation)")
    modalities = _modalities(overrides)
    voice = overrides.get("voice")
    if isinstance(overrides.get("audio"), dict):
        voice = _audio_settings(overrides["audio"], []).get("voice", voice)
    instructions = overrides.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise invalid_request("response.instructions", "response.instructions: a string")
    limit = overrides.get("max_output_tokens", overrides.get("max_response_output_tokens"))
    if limit == "inf":
        limit = None
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise invalid_request("response.max_output_tokens", 'response.max_output_tokens: an integer >= 1 or "inf"')
    return audio_out if modalities is None else modalities, voice, instructions, limit


def _item_content(role: str, parts: list, rate: int) -> tuple[list[dict] | str, list[dict]]:
    """A conversation item's parts -> (chat message content, the parts as echoed)."""
    content, shown = [], []
    for i, part in enumerate(parts):
        where = f"item.content[{i}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if role == "assistant":
            text = part.get("text", part.get("transcript")) if kind in ("output_text", "text", "output_audio",
                                                                          "audio") else None
            if not isinstance(text, str):
                raise invalid_request(where, f"{where}: an assistant part is output_text (text) or output_audio "
                                             "(transcript)")
            content.append(text)
            shown.append(part)
        elif kind in ("input_text", "text") and isinstance(part.get("text"), str):
            content.append({"type": "text", "text": part["text"]})
            shown.append({"type": "input_text", "text": part["text"]})
        elif kind == "input_audio" and role == "user":
            content.append(_recording_part(_pcm(part.get("audio"), f"{where}.audio"), rate))
            shown.append({"type": "input_audio", "transcript": part.get("transcript")})
        elif kind == "input_image" and role == "user" and isinstance(part.get("image_url"), str):
            content.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
            shown.append({"type": "input_image"})
        else:
            raise invalid_request(where, f"{where}: {role} parts are input_text"
                                         + (", input_audio or input_image" if role == "user" else ""))
    if role == "assistant":
        return "".join(content), shown
    if role == "system":
        return "".join(p["text"] for p in content), shown
    return content, shown
