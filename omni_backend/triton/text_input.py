"""Text that arrives while a stream runs: the `CONTROL=append` channel.

A client opens a stream whose PARAMS say `"streaming_input": true` (a pipeline that can read text
as it arrives declares that parameter in its adapter) with the first piece of text as TEXT, and a
request id. Each later piece is a request to the same entry model, sent after the previous one
was answered (so pieces stay in order): `CONTROL=append`, TEXT = the piece (may be empty or blank), PARAMS =
`{"request_id": "<the stream's request id>", "end": <bool>}`; `end: true` says the text is
complete. The answer is empty once the stages that read the client's request took the piece, or an
error (`invalid_request: request_id: ...` when no such stream is open on this instance).

The entry hands each piece, in arrival order, to every stage fed by the client's request, with
`CONTROL=append` and that stage stream's own REQUEST_ID (bls.append_stage_text; a stage in the
entry's process is handed it directly, local_stage.py), never before the
stage has been sent the stream's request itself. Text travels only between one entry instance and
its stages: with several entry instances a piece can reach an instance that does not hold the
stream, and is refused.
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Protocol

from omni_backend.adapters.base import MAX_TEXT_CHARS, check_string, shown
from omni_backend.errors import InvalidRequest


STREAMING_INPUT = "streaming_input"   # the request parameter of pipelines that read text as it arrives
# An append sent on its own gRPC call may overtake the request that opens its stream: it waits this
# long for the stream to appear (the same holds between the entry and a stage).
TARGET_WAIT_S = 5.0


class TextTarget(Protocol):
    """A stage's stream that takes text (bls.StageStream, local_stage.LocalStageStream)."""

    async def append_text(self, text: str, end: bool) -> None:
        """Hand the piece to the stage once it has the stream; raises the stage's error."""
        ...


def _piece(raw: bytes | str | None, field: str) -> str:
    """One piece of text: UTF-8, no NUL or lone surrogate, at most MAX_TEXT_CHARS; empty is fine."""
    if raw is None:
        return ""
    if isinstance(raw, bytes):
        if len(raw) > 4 * MAX_TEXT_CHARS:
            raise InvalidRequest(field, f"is {len(raw)} bytes; a piece is at most {MAX_TEXT_CHARS} characters")
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidRequest(field, f"is not valid UTF-8 (byte {e.start}: {e.reason})") from None
    if not isinstance(raw, str):
        raise InvalidRequest(field, f"must be a string, got {shown(raw)}")
    if len(raw) > MAX_TEXT_CHARS:
        raise InvalidRequest(field, f"is {len(raw)} characters; a piece is at most {MAX_TEXT_CHARS}")
    check_string(field, raw)
    return raw


def _end(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(field, f"must be true or false, got {shown(value)}")
    return value


def parse_entry_append(text: bytes | None, params: bytes | None) -> tuple[str, str, bool]:
    """A client's append request -> (the stream's request id, the piece, end)."""
    piece = _piece(text, "text")
    try:
        fields = json.loads(params or b"{}")
    except (ValueError, RecursionError):
        raise InvalidRequest("params", "an append's PARAMS must be a JSON object "
                                       "{\"request_id\": ..., \"end\": ...}") from None
    if not isinstance(fields, dict):
        raise InvalidRequest("params", "an append's PARAMS must be a JSON object")
    unknown = sorted(set(fields) - {"request_id", "end"})
    if unknown:
        raise InvalidRequest("params", f"unknown field {shown(unknown[0])} in an append; allowed: end, request_id")
    request_id = fields.get("request_id")
    if not isinstance(request_id, str) or not request_id:
        raise InvalidRequest("request_id", "required: the request id of the stream to append to")
    return request_id, piece, _end(fields.get("end", False), "end")


def parse_stage_append(raw: bytes | None) -> tuple[str, bool]:
    """The entry's append to a stage (REQUEST `{"text", "end"}`) -> (the piece, end)."""
    try:
        fields = json.loads(raw or b"")
    except (ValueError, RecursionError):
        fields = None
    if not isinstance(fields, dict):
        raise InvalidRequest("REQUEST", "an append carries {\"text\": ..., \"end\": ...}")
    return _piece(fields.get("text"), "text"), _end(fields.get("end", False), "end")


class TextForwarder:
    """One stream's pieces, handed to its stages one at a time in arrival order."""

    def __init__(self, targets: list[TextTarget]):
        self.targets = targets
        self.ended = False
        self._queue: asyncio.Queue = asyncio.Queue()
        self._task: asyncio.Task | None = None

    async def send(self, piece: str, end: bool) -> None:
        """Queue a piece (before any await: the arrival order is kept) and wait until every
        stage took it; raises the first stage's error."""
        if self.ended:
            raise InvalidRequest("end", "this stream's text has ended; no more text is taken")
        self.ended = end
        done = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((piece, end, done))
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        await done

    async def _run(self) -> None:
        while True:
            piece, end, done = await self._queue.get()
            try:
                for target in self.targets:
                    await target.append_text(piece, end)
            except asyncio.CancelledError:   # the stream ended with this piece on its way: answered
                if not done.done():          # here, or its append would wait for ever
                    done.set_exception(_ended())
                raise
            except Exception as e:  # the piece's own request answers with it
                if not done.done():
                    done.set_exception(e)
            else:
                if not done.done():
                    done.set_result(None)

    async def aclose(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        while not self._queue.empty():
            _, _, done = self._queue.get_nowait()
            if not done.done():
                done.set_exception(_ended())


def _ended() -> InvalidRequest:
    return InvalidRequest("request_id", "the stream ended before this text reached it")


class TextInputs:
    """An entry's streams that take text while they run, by the client's request id."""

    def __init__(self) -> None:
        self.open: dict[str, TextForwarder] = {}

    def register(self, request_id: str, targets: list[TextTarget]) -> TextForwarder:
        if not request_id:
            raise InvalidRequest("request_id", f"{STREAMING_INPUT} needs a request id (text is appended by it)")
        if request_id in self.open:
            raise InvalidRequest("request_id", f"a stream with request id {request_id!r} is already taking text")
        forwarder = self.open[request_id] = TextForwarder(targets)
        return forwarder

    async def unregister(self, request_id: str, forwarder: TextForwarder) -> None:
        if self.open.get(request_id) is forwarder:
            del self.open[request_id]
        await forwarder.aclose()

    async def append(self, text: bytes | None, params: bytes | None) -> None:
        request_id, piece, end = parse_entry_append(text, params)
        forwarder = self.open.get(request_id)
        deadline = time.monotonic() + TARGET_WAIT_S
        while forwarder is None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
            forwarder = self.open.get(request_id)
        if forwarder is None:
            raise InvalidRequest("request_id", f"no open stream {request_id!r} takes text on this instance "
                                               "(it ended, or was not opened with streaming_input)")
        await forwarder.send(piece, end)
