"""A client of `WS /v1/audio/speech/stream` (the `websockets` package): text in as it is written,
audio out as it is made. Used by `python -m client.stream --stdin`, the tests and perf/.

    async with SpeechStreamClient("ws://localhost:8080/v1/audio/speech/stream", config) as session:
        await session.send_text("Hello, ")
        await session.send_text("world.")
        utterance = await session.finish()     # input.done, then every message up to session.done
        utterance.audio                         # bytes of all audio frames, in order

Each received message is kept with the time it arrived (`Received`), so callers can measure the
delay from a word's arrival to its audio.
"""
from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import dataclass, field
from typing import Any

WS_PATH = "/v1/audio/speech/stream"


@dataclass
class Received:
    at: float                   # time.perf_counter() when it arrived
    message: dict[str, Any] | None = None   # a JSON message
    audio: bytes | None = None              # a binary frame (or an audio.chunk's audio_b64)


@dataclass
class Utterance:
    received: list[Received] = field(default_factory=list)

    @property
    def audio(self) -> bytes:
        return b"".join(r.audio for r in self.received if r.audio is not None)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [r.message for r in self.received if r.message is not None]

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [m for m in self.messages if m.get("type") == "error"]

    def sentence_audio(self) -> list[bytes]:
        """Audio per sentence (between audio.start and audio.done)."""
        out: list[bytes] = []
        for r in self.received:
            if r.message is not None and r.message.get("type") == "audio.start":
                out.append(b"")
            elif r.audio is not None and out:
                out[-1] += r.audio
        return out


def ws_url(http_url: str) -> str:
    """`http://host:port` -> `ws://host:port/v1/audio/speech/stream`."""
    return http_url.replace("http://", "ws://", 1).replace("https://", "wss://", 1).rstrip("/") + WS_PATH


class SpeechStreamClient:
    """One connection; a reader task keeps every message with its arrival time in `received`."""

    def __init__(self, url: str, config: dict[str, Any], api_key: str | None = None):
        self.url = url
        self.config = config
        self.api_key = api_key
        self.ws = None
        self.sent: list[tuple[float, str]] = []   # (time, text) of each input.text
        self.received: list[Received] = []
        self.closed: BaseException | None = None  # why the reader stopped
        self._taken = 0                            # received items handed to an Utterance
        self._arrived = asyncio.Event()
        self._reader: asyncio.Task | None = None

    async def __aenter__(self) -> "SpeechStreamClient":
        from websockets.asyncio.client import connect

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        self.ws = await connect(self.url, additional_headers=headers, max_size=None)
        self._reader = asyncio.ensure_future(self._read())
        await self.ws.send(json.dumps({"type": "session.config", **self.config}))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.ws.close()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)

    async def _read(self) -> None:
        try:
            async for data in self.ws:
                now = time.perf_counter()
                if isinstance(data, bytes):
                    self.received.append(Received(now, audio=data))
                else:
                    message = json.loads(data)
                    audio = base64.b64decode(message.get("audio_b64") or "") if message.get("type") == "audio.chunk" \
                        else None
                    self.received.append(Received(now, message=message, audio=audio))
                self._arrived.set()
        except BaseException as e:  # noqa: BLE001 - kept for the waiting caller
            self.closed = e
        else:
            self.closed = ConnectionError("the server closed the connection")
        finally:
            self._arrived.set()

    async def send_text(self, text: str) -> None:
        self.sent.append((time.perf_counter(), text))
        await self.ws.send(json.dumps({"type": "input.text", "text": text}))

    async def commit(self, commit_id: str | None = None) -> None:
        """vLLM-Omni's `input.commit`: the text sent so far is final (answered `input.committed`)."""
        await self.ws.send(json.dumps({"type": "input.commit", "commit_id": commit_id}))

    async def wait_message(self, kind: str, timeout_s: float = 120.0) -> Received:
        """The first message of this type not yet handed out (waits for it)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for item in self.received[self._taken:]:
                if item.message is not None and item.message.get("type") == kind:
                    return item
            if self.closed is not None:
                errors = [r.message for r in self.received if r.message and r.message.get("type") == "error"]
                said = f"; the server's last error: {errors[-1]}" if errors else ""
                raise ConnectionError(f"connection closed before {kind}: {self.closed!r}{said}")
            self._arrived.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {kind} within {timeout_s} s")
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    async def finish(self, timeout_s: float = 120.0) -> Utterance:
        """input.done, then everything up to this utterance's session.done."""
        await self.ws.send(json.dumps({"type": "input.done"}))
        done = await self.wait_message("session.done", timeout_s)
        end = self.received.index(done) + 1
        utterance = Utterance(self.received[self._taken:end])
        self._taken = end
        return utterance

    async def close_session(self) -> None:
        await self.ws.send(json.dumps({"type": "session.close"}))
