"""`WS /v1/audio/speech/stream`: text in as it is written, audio out as it is made.

Wire-compatible with vLLM-Omni's endpoint. Client messages (JSON text frames): `session.config`
(first; again between utterances to change the fields it names for the utterances that follow;
stream_config.py), `input.text` (`text`), `input.commit` (vLLM-Omni's `commit_id`: the text so far is
final; answered `input.committed` with its `sentence_index`), `input.done` (ends the utterance;
the connection stays), `session.close`. Server messages:
`audio.start` (`utterance_index`, `sentence_index`, `sentence_text`, `format`, `sample_rate`),
the audio as binary frames (with `audio_transport: json`: `audio.chunk` messages carrying
`audio_b64`), `audio.done` (`total_bytes`, `error`), `session.done` (`utterance_index`,
`total_sentences`: the utterance is over, not the connection), and `error` (`message` starting with
our stable code `invalid_request` / `unavailable` / `internal`, `code`, `param`).

`split_granularity` decides how text becomes requests: `none` one request per utterance at
`input.done`; `sentence` / `clause` a request per unit as soon as it is complete (text_splitter.py),
spoken one after another; `append` one request per utterance that opens with the first words and
takes the rest as it arrives (client/triton_text_stream.py), so speech starts before the text is
complete and keeps one prosody. Utterances are spoken in order; each unit's audio is a stream of
its own in `response_format` (a new header for wav).

Limits (config.StreamLimits): the first message within `config_timeout_s`; `idle_timeout_s`
without a message while nothing is being spoken closes the session; `max_session_s` per
connection; `max_text_chars` per utterance; message sizes. Back-pressure: audio is read from
Triton only as fast as the client takes it (each send waits for the socket), and a client that
takes nothing for `send_timeout_s` is cut off, so a slow client never makes the server buffer
without bound. A client that disconnects cancels whatever it started (the Triton streams end,
their slots are freed).

Each unit is admitted as an HTTP request is (admitted_stream.py): the pipeline's stream limit,
the pool's choice of endpoint (the session's own while it can serve; before its first audio a
unit moves off an endpoint that cannot take it), and one access-log line per unit (method `WS`,
request id `ws-<session>-<n>`).
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import uuid
from typing import Any

import numpy as np
from starlette.websockets import WebSocket, WebSocketDisconnect

from client.speech_api.access_log import log_request
from client.speech_api.admitted_stream import AdmittedStream
from client.speech_api.chat_request import refuse_chat_pipeline
from client.speech_api.encoders import make_encoder
from client.speech_api.encoders.base import pcm16
from client.speech_api.errors import ApiError, from_triton, internal, invalid_request, model_not_found, no_backend
from client.speech_api.field_checks import clean_string
from client.speech_api.media_fetch import fetch_ref_audio
from client.speech_api.resample import Resampler
from client.speech_api.pool import TritonEndpoint
from client.speech_api.speed import TimeStretch
from client.speech_api.stream_config import SessionConfig, error_message, merged_config, parse_session_config
from client.speech_api.text_splitter import TextSplitter
from client.triton_stream import TritonStreamError, uncancelled
from omni_backend.adapters.base import MAX_TEXT_CHARS

log = logging.getLogger("omni.speech_api")


# an append refused just as its stream ended (Triton answers it once it looked for the stream for
# text_input.TARGET_WAIT_S): the audio's end is waited for this long before the refusal counts
APPEND_AFTER_END_S = 1.0


class SlowClient(Exception):
    """The client took no audio for `send_timeout_s`."""


class ClientGone(Exception):
    """The socket is closed."""


class AudioPipe:
    """One unit's audio: time-stretch (speed), resample (sample_rate), encode (response_format)."""

    def __init__(self, config: SessionConfig, rate: int):
        self.format = config.response_format
        self.out_rate = config.sample_rate or rate
        stretch = config.request.speed.stretch
        self.stretch = TimeStretch(stretch, rate) if stretch != 1.0 else None
        self.resampler = Resampler(rate, self.out_rate) if self.out_rate != rate else None
        # pcm is sent at the session's rate (the HTTP API's pcm is always 24 kHz)
        self.encoder = None if self.format == "pcm" else make_encoder(self.format, self.out_rate)

    def push(self, audio: np.ndarray) -> bytes:
        if self.stretch is not None:
            audio = self.stretch.push(audio)
        if self.resampler is not None:
            audio = self.resampler.push(audio)
        return pcm16(audio) if self.encoder is None else self.encoder.encode(audio)

    def finish(self) -> bytes:
        tail = np.zeros(0, np.float32)
        if self.stretch is not None:
            tail = self.stretch.flush()
        if self.resampler is not None:
            tail = np.concatenate([self.resampler.push(tail), self.resampler.flush()])
        if self.encoder is None:
            return pcm16(tail)
        return (self.encoder.encode(tail) if tail.size else b"") + self.encoder.finish()


class Utterance:
    """Text between two `input.done`s and its audio; speaks after the utterance before it."""

    def __init__(self, session: "SpeechStreamSession", index: int, previous: "Utterance | None"):
        self.session = session
        self.config = session.config
        self.index = index
        self.previous = previous
        self.chars = 0
        self.done_received = False
        self.sentences = 0
        self.text = ""
        self.splitter = TextSplitter("none" if self.config.split == "append" else self.config.split)
        self.queue: asyncio.Queue = asyncio.Queue()   # units (split modes) or pieces (append); None ends
        self.commits = 0
        self.task = asyncio.ensure_future(self._run())

    @property
    def busy(self) -> bool:
        return not self.task.done()

    def add_text(self, text: str) -> None:
        limit = self.session.limits.max_text_chars
        if self.chars + len(text) > limit:
            raise invalid_request("input.text", f"input.text: the utterance would be {self.chars + len(text)} "
                                                f"characters; the limit is {limit}", code="string_above_max_length")
        self.chars += len(text)
        self.text += text
        if self.config.split == "append":
            self.queue.put_nowait(text)
        else:
            for unit in self.splitter.feed(text):
                self.queue.put_nowait(unit)

    def commit(self) -> int:
        """vLLM-Omni's `input.commit`: the text so far is final. Split modes speak what is held
        back as a unit now; append mode has fed it already. Returns the commit's index."""
        if self.config.split != "append":
            for unit in self.splitter.flush():
                self.queue.put_nowait(unit)
        self.commits += 1
        return self.commits - 1

    def finish(self) -> None:
        self.done_received = True
        if self.config.split != "append":
            for unit in self.splitter.flush():
                self.queue.put_nowait(unit)
        self.queue.put_nowait(None)

    async def wait(self) -> None:
        await asyncio.gather(self.task, return_exceptions=True)

    async def _run(self) -> None:
        if self.previous is not None:
            await self.previous.wait()
        try:
            try:
                if self.config.split == "append":
                    await self._speak_appended()
                else:
                    while (unit := await self.queue.get()) is not None:
                        await self._speak_unit(unit)
            except (ClientGone, SlowClient, asyncio.CancelledError):
                raise
            except Exception as e:  # noqa: BLE001 - told; the session goes on, and the utterance ends
                await self.session.send_error(self._coded(e))
                await self._skip_to_input_done()
            await self.session.send_json({"type": "session.done", "utterance_index": self.index,
                                          "total_sentences": self.sentences})
        except (ClientGone, SlowClient) as e:
            self.session.stop(e)   # the whole session ends: the client is gone, or takes no audio

    # -- one request per unit (none / sentence / clause)
    async def _speak_unit(self, text: str) -> None:
        sentence = self.sentences
        self.sentences += 1
        request = self.config.request
        await self._start_message(sentence, text)
        admitted = self.session.admit(request)
        spoken = SpokenUnit()
        try:
            await admitted.open(text, request.params, prefer=self.session.home)
            self.session.home = admitted.stream.endpoint
            await self._send_audio(sentence, admitted, spoken)
        except (ClientGone, SlowClient):
            raise
        except Exception as e:  # noqa: BLE001 - every failure is told, and the utterance goes on
            spoken.failed(self._coded(e), admitted.access)
            await self.session.send_error(spoken.error)
        finally:
            await admitted.close()
            self.session.log_access(admitted, spoken)
        await self._done_message(sentence, spoken.bytes, spoken.error is not None)

    # -- one request that takes the text as it arrives (append)
    async def _speak_appended(self) -> None:
        first = ""
        while not first.strip():
            piece = await self.queue.get()
            if piece is None:
                break
            first += piece
        if not first.strip():
            return   # an utterance without words: nothing to speak
        # one request's text is at most MAX_TEXT_CHARS; the rest of a longer first piece is appended
        first, rest = first[:MAX_TEXT_CHARS], first[MAX_TEXT_CHARS:]
        request = self.config.request
        self.sentences = 1
        await self._start_message(0, first)
        admitted = self.session.admit(request)
        spoken = SpokenUnit()
        feeder = sender = None
        try:
            stream = await admitted.open_text(first, request.params, prefer=self.session.home)
            self.session.home = stream.endpoint
            # neither task may end cancelled by grpc.aio: that would read as this task's own cancel
            feeder = asyncio.ensure_future(uncancelled(self._feed(stream, rest)))
            sender = asyncio.ensure_future(uncancelled(self._send_audio(0, admitted, spoken)))
            done, _ = await asyncio.wait({feeder, sender}, return_when=asyncio.FIRST_COMPLETED)
            if sender not in done and feeder.exception() is not None:
                # a piece Triton refused ends the utterance now, not when the pipeline gives up
                # waiting for text; unless the request had just ended (at its frame limit), when
                # the refusal is only that (the audio is complete)
                await asyncio.wait({sender}, timeout=APPEND_AFTER_END_S)
                if not sender.done():
                    await feeder
            # the audio is all there is: once it is complete, text still coming is not spoken
            # (as a whole request's text past its frame limit is not)
            await sender
        except (ClientGone, SlowClient):
            raise
        except Exception as e:  # noqa: BLE001 - every failure is told, and the utterance goes on
            spoken.failed(self._coded(e), admitted.access)
            await self.session.send_error(spoken.error)
        finally:
            unfinished = [t for t in (feeder, sender) if t is not None and not t.done()]
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)
            await admitted.close()
            self.session.log_access(admitted, spoken)
        if spoken.error is None:   # audio.done names the utterance's whole text
            await self._skip_to_input_done()
        await self._done_message(0, spoken.bytes, spoken.error is not None, text=self.text)
        if spoken.error is not None:   # told at once; session.done still follows input.done
            await self._skip_to_input_done()

    async def _skip_to_input_done(self) -> None:
        """When the utterance's request ended before the client's input.done (a failure, or its
        frame limit): wait for that input.done, as always; the text in between has nowhere to go."""
        if not self.done_received:
            while await self.queue.get() is not None:
                pass

    def _coded(self, error: Exception) -> ApiError:
        """A unit's failure as the client is told it: ours and Triton's keep their code; anything
        else is a bug, logged, and told as `internal` (before, it left the client without
        audio.done or session.done until the idle timeout closed the session)."""
        if isinstance(error, ApiError):
            return error
        if isinstance(error, TritonStreamError):
            return from_triton(str(error))
        log.error("utterance %d of session %s failed", self.index, self.session.session_id,
                  exc_info=(type(error), error, error.__traceback__))
        return internal(f"{type(error).__name__}: {error}")

    async def _feed(self, stream, first: str = "") -> None:
        """Pieces to Triton in order; those that arrive while one is on its way go together."""
        if first:
            await stream.append(first)
        while True:
            pieces = [await self.queue.get()]
            while not self.queue.empty() and pieces[-1] is not None:
                pieces.append(self.queue.get_nowait())
            end = pieces[-1] is None
            text = "".join(p for p in pieces if p is not None)
            if text:
                await stream.append(text)
            if end:
                await stream.end()
                return

    # -- messages
    async def _start_message(self, sentence: int, text: str) -> None:
        await self.session.send_json({"type": "audio.start", "utterance_index": self.index, "sentence_index": sentence,
                                      "sentence_text": text, "format": self.config.response_format})

    async def _done_message(self, sentence: int, total: int, failed: bool, text: str | None = None) -> None:
        message = {"type": "audio.done", "utterance_index": self.index, "sentence_index": sentence,
                   "total_bytes": total, "error": failed}
        if text is not None:
            message["sentence_text"] = text
        await self.session.send_json(message)

    async def _send_audio(self, sentence: int, admitted: AdmittedStream, spoken: "SpokenUnit") -> None:
        pipe, chunk_id = None, 0
        loop = asyncio.get_running_loop()
        assert admitted.stream is not None
        async for audio, rate in admitted.stream.chunks():
            if pipe is None:
                pipe = AudioPipe(self.config, rate)
                admitted.sample_rate = rate
                admitted.access.setdefault("ttfa_ms", (time.perf_counter() - spoken.t0) * 1000.0)
            admitted.audio_samples += audio.size
            data = await loop.run_in_executor(None, pipe.push, audio)
            if data:
                await self.session.send_audio(self.config, data, self.index, sentence, chunk_id, pipe.out_rate)
                spoken.sent(len(data))
                chunk_id += 1
        if pipe is not None:
            data = await loop.run_in_executor(None, pipe.finish)
            if data:
                await self.session.send_audio(self.config, data, self.index, sentence, chunk_id, pipe.out_rate)
                spoken.sent(len(data))
        admitted.finished()


class SpokenUnit:
    """What one unit's stream sent the client, for its access-log line."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.bytes = 0
        self.first_byte: float | None = None
        self.error: ApiError | None = None

    def sent(self, size: int) -> None:
        if self.first_byte is None:
            self.first_byte = time.perf_counter()
        self.bytes += size

    def failed(self, error: ApiError, access: dict[str, Any]) -> None:
        self.error = error
        access["error"] = error.code
        access["outcome"] = f"error {error.status}"


class SpeechStreamSession:
    def __init__(self, ws: WebSocket, shim: Any):
        self.ws = ws
        self.shim = shim
        self.limits = shim.config.stream_limits
        self.config: SessionConfig | None = None
        self.config_fields: dict[str, Any] = {}     # every session.config so far, later fields over earlier
        self.utterance: Utterance | None = None      # the one taking text now (no input.done yet)
        self.utterances: list[Utterance] = []
        self.next_index = 0
        self._send_lock = asyncio.Lock()
        self._requests = 0
        self.session_id = uuid.uuid4().hex[:16]
        self.failure: BaseException | None = None   # why an utterance ended the session
        self._reader: asyncio.Task | None = None
        # the Triton this session's requests go to while it can serve them: a session's
        # utterances stay on one server (one pod), and move only when it cannot take them
        self.home: TritonEndpoint | None = None

    def stop(self, failure: BaseException) -> None:
        """End the session from an utterance (the client is gone, or takes no audio)."""
        self.failure = self.failure or failure
        if self._reader is not None:
            self._reader.cancel()

    def request_id(self) -> str:
        self._requests += 1
        return f"ws-{self.session_id}-{self._requests}"

    def admit(self, request: Any) -> AdmittedStream:
        """The next unit's stream, under the pipeline's admission (not opened yet)."""
        access = {"model": request.pipeline, "format": self.config.response_format, "stream": "ws",
                  "split": self.config.split}
        return AdmittedStream(self.shim.pool, self.shim.limiter, request.pipeline, self.request_id(), access)

    def log_access(self, admitted: AdmittedStream, spoken: SpokenUnit) -> None:
        client = self.ws.client.host if self.ws.client else "-"
        status = spoken.error.status if spoken.error is not None else 200
        log_request(admitted.request_id, client, "WS", self.ws.url.path, status, spoken.bytes, spoken.t0,
                    None, spoken.first_byte, time.perf_counter(), admitted.access)

    # -- sending (one message at a time; each waits for the socket, bounded by send_timeout_s)
    async def _send(self, message: dict) -> None:
        async with self._send_lock:
            try:
                await asyncio.wait_for(self.ws.send(message), self.limits.send_timeout_s)
            except asyncio.TimeoutError:
                raise SlowClient() from None
            except (WebSocketDisconnect, RuntimeError, OSError):
                raise ClientGone() from None

    async def send_json(self, payload: dict) -> None:
        text = json.dumps(payload, ensure_ascii=False)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:   # a client's lone surrogate quoted back: \ud800 escapes instead
            text = json.dumps(payload)
        await self._send({"type": "websocket.send", "text": text})

    async def send_audio(self, config: SessionConfig, data: bytes, utterance: int, sentence: int, chunk_id: int,
                         rate: int) -> None:
        """Audio as the utterance's config says (a later session.config is for later utterances)."""
        if config.transport == "json":
            await self.send_json({"type": "audio.chunk", "utterance_index": utterance, "sentence_index": sentence,
                                  "chunk_id": chunk_id, "format": config.response_format, "sample_rate": rate,
                                  "audio_b64": base64.b64encode(data).decode("ascii")})
        else:
            await self._send({"type": "websocket.send", "bytes": data})

    async def send_error(self, error: ApiError) -> None:
        await self.send_json(error_message(error))

    # -- the session
    async def run(self) -> None:
        await self.ws.accept()
        reader = self._reader = asyncio.ensure_future(self._receive())
        try:
            done, _ = await asyncio.wait({reader}, timeout=self.limits.max_session_s)
            if self.failure is not None:
                raise self.failure
            if not done:
                await self._fail(invalid_request("session", f"session: longer than {self.limits.max_session_s:g} s; "
                                                            "closing (max session length)"))
            elif not reader.cancelled() and reader.exception() is not None \
                    and not isinstance(reader.exception(), ClientGone):
                raise reader.exception()
        except SlowClient:
            await self._fail(invalid_request("session", f"session: the client took no audio for "
                                                        f"{self.limits.send_timeout_s:g} s; closing (back-pressure)"))
        except ClientGone:
            pass
        except Exception as e:  # noqa: BLE001 - a bug still ends with a coded error
            log.exception("speech stream session failed")
            await self._fail(internal(f"{type(e).__name__}: {e}"))
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            for utterance in self.utterances:   # cancels the Triton streams they hold
                utterance.task.cancel()
            await asyncio.gather(*(u.task for u in self.utterances), return_exceptions=True)
            try:
                await self.ws.close()
            except Exception:  # noqa: BLE001 - already closed by the client
                pass

    async def _fail(self, error: ApiError) -> None:
        """Tell the client why the session ends (it is closed after this)."""
        log.info("speech stream session %s closed: %s", self.session_id, error.message)
        try:
            async with self._send_lock:
                await asyncio.wait_for(self.ws.send({"type": "websocket.send",
                                                     "text": json.dumps(error_message(error))}), 1.0)
        except Exception:  # noqa: BLE001 - the client may be gone or stuck
            pass

    def _speaking(self) -> bool:
        return any(u.busy for u in self.utterances)

    async def _receive(self) -> None:
        while True:
            timeout = self.limits.config_timeout_s if self.config is None else self.limits.idle_timeout_s
            try:
                message = await asyncio.wait_for(self.ws.receive(), timeout)
            except asyncio.TimeoutError:
                if self.config is not None and self._speaking():
                    continue   # waiting for audio to be spoken is not idling
                what = "no session.config" if self.config is None else "no message"
                await self._fail(invalid_request("session", f"session: {what} for {timeout:g} s; closing "
                                                            f"({'config' if self.config is None else 'idle'} timeout)"))
                return
            if message["type"] == "websocket.disconnect":
                raise ClientGone()
            if await self._handle(message) is False:
                return
            self.utterances = [u for u in self.utterances if u.busy or u is self.utterance]

    async def _handle(self, message: dict) -> bool:
        """One client message; False ends the session."""
        raw = message.get("text")
        if raw is None:
            await self.send_error(invalid_request(None, "binary messages are not accepted; send JSON text"))
            return self.config is not None
        size = len(raw.encode("utf-8", "surrogatepass"))
        try:
            msg = json.loads(raw) if size <= self.limits.max_message_bytes else None
        except ValueError:
            msg = "bad"
        except RecursionError:   # the client's nesting, as the HTTP body's: not our failure
            await self.send_error(invalid_request(None, "the message is nested too deeply to be a session message",
                                                  code="invalid_json"))
            return self.config is not None
        if msg is None:
            await self.send_error(invalid_request(None, f"message of {size} bytes is too large",
                                                  code="request_too_large"))
            return self.config is not None
        if not isinstance(msg, dict):
            await self.send_error(invalid_request(None, "messages must be JSON objects"))
            return self.config is not None
        kind = msg.get("type")
        if kind != "session.config" and size > self.limits.max_text_message_bytes:
            await self.send_error(invalid_request("input.text", f"input.text: message of {size} bytes is too large "
                                                                f"(limit {self.limits.max_text_message_bytes})",
                                                  code="request_too_large"))
            return True
        if kind == "session.config":
            if self.utterance is not None:
                await self.send_error(invalid_request("session.config", "session.config: not while an utterance "
                                                                        "is in progress; send input.done first"))
                return True
            fields = merged_config(self.config_fields, msg)
            try:
                await fetch_ref_audio(fields, self.shim.config.fetch)   # kept fetched for later configs
                self.config = parse_session_config(fields, self._resolve, self.shim.catalog, self.shim.voices)
            except ApiError as e:
                await self.send_error(e)          # the config before it stays
                return self.config is not None   # a bad first config ends the session
            self.config_fields = fields
            return True
        if self.config is None:
            await self.send_error(invalid_request("type", f"type: expected session.config first, got {kind!r}"))
            return False
        if kind == "input.text":
            text = msg.get("text", "")
            if not isinstance(text, str):
                await self.send_error(invalid_request("text", "text: input.text needs a string"))
                return True
            if not text:
                return True
            try:   # a lone surrogate or NUL cannot reach Triton (or go back in audio.start)
                clean_string("text", text)
            except ApiError as e:
                await self.send_error(e)
                return True
            self._open_utterance()
            try:
                self.utterance.add_text(text)
            except ApiError as e:
                await self.send_error(e)
            return True
        if kind == "input.commit":
            commit_id = msg.get("commit_id")
            if commit_id is not None and (not isinstance(commit_id, str) or len(commit_id) > 256):
                await self.send_error(invalid_request("commit_id", "commit_id: a string of at most 256 characters"))
                return True
            self._open_utterance()
            await self.send_json({"type": "input.committed", "commit_id": commit_id,
                                  "utterance_index": self.utterance.index, "sentence_index": self.utterance.commit()})
            return True
        if kind == "input.done":
            self._open_utterance()
            self.utterance.finish()
            self.utterance = None
            return True
        if kind == "session.close":
            pending = [u for u in self.utterances if u.done_received]
            if self.utterance is not None:
                self.utterance.task.cancel()
            await asyncio.gather(*(u.task for u in pending), return_exceptions=True)
            return False
        await self.send_error(invalid_request("type", f"type: unknown message type {kind!r}"))
        return True

    def _open_utterance(self) -> None:
        if self.utterance is None:
            previous = self.utterances[-1] if self.utterances else None
            self.utterance = Utterance(self, self.next_index, previous)
            self.next_index += 1
            self.utterances.append(self.utterance)

    def _resolve(self, model: str) -> str:
        pipeline = served_pipeline(self.shim, model)
        refuse_chat_pipeline(self.shim.catalog.get(pipeline))
        return pipeline


def served_pipeline(shim: Any, model: str) -> str:
    """The pipeline behind a WebSocket session's `model`: 404 when Triton is up and lacks it,
    503 when no Triton is reachable (as the HTTP routes answer)."""
    pipeline = shim.catalog.resolve(model)
    if pipeline is None:
        if not shim.pool.any_healthy():
            raise no_backend("No Triton server is reachable", 2.0)
        raise model_not_found(model, shim.catalog.model_names())
    return pipeline


__all__ = ["SpeechStreamSession", "served_pipeline"]
