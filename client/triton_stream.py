"""Streaming a pipeline's entry model over gRPC with tritonclient (sync and asyncio).

Every failure is a `TritonStreamError` whose message starts with a stable code
(`invalid_request: <field>: ...`, `unavailable: ...`, `internal: ...`): the entry model's own
errors already do; Triton's own ones get one here (`coded`). In the asyncio variant a gRPC
failure of the channel stays a `grpc.RpcError`, so a caller with several endpoints can tell a
dead server from a bad request.
"""
from __future__ import annotations

import asyncio
import json
import queue
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import numpy as np

from omni_backend.errors import error_code, with_code
from omni_backend.playback import Playback, playback_of
from omni_backend.grpc_streams import cancelled_by_us, end_stream

# Triton's own checks of a request's tensors, made before the entry model sees it (wrong dtype,
# wrong shape, an input the model does not have, ...). They carry no code; the tensor they name
# is the field, in the adapters' spelling (TEXT -> text).
_TRITON_BAD_INPUT = (re.compile(r"missing required input\(s\) \['(?P<name>[A-Za-z0-9_]+)'"),
                     re.compile(r"input '(?P<name>[A-Za-z0-9_]+)'"))
# gRPC status codes (tritonclient's `status()`) that mean "the server cannot be reached now".
# The aio client's request dicts take no `enable_empty_final_response`: without this parameter a
# stream's flag-only final response is never sent, and the client cannot tell it has everything.
EMPTY_FINAL = {"triton_enable_empty_final_response": True}
_GRPC_UNAVAILABLE = ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED", "StatusCode.CANCELLED")
# A stream silent this long asks whether its model is still ready. Triton 2.51 never ends the
# streams of an entry whose stub died: without this they wait for the caller's own timeout. The
# supervisor restarts such a server (the stream then fails at once), or, told not to, unloads the
# pipeline within a second or so to reload it, which this sees.
WATCH_S = 2.0


def _not_ready(model: str) -> "TritonStreamError":
    return TritonStreamError(f"unavailable: '{model}' is not ready on Triton (it is being restarted "
                             "after a failure, or the server is stopping); the stream was cut, retry")


def coded(message: str, grpc_status: str | None = None) -> str:
    """The message with its stable code in front: Triton's input checks are invalid_request
    naming the tensor, a channel that failed is unavailable, the rest as `with_code` says."""
    if error_code(message) != "internal" or message.startswith("internal:"):
        return with_code(message)
    if grpc_status in _GRPC_UNAVAILABLE:
        return f"unavailable: {message}"
    for pattern in _TRITON_BAD_INPUT:
        bad_input = pattern.search(message)
        if bad_input is not None:
            return f"invalid_request: {bad_input['name'].lower()}: {message}"
    return with_code(message)


class TritonStreamError(RuntimeError):
    """A stream that failed: an error response from the server, or a request that cannot be
    sent. The message starts with its code; `.code` is invalid_request / unavailable / internal."""

    def __init__(self, message: str, grpc_status: str | None = None):
        message = coded(message, grpc_status)
        super().__init__(message)
        self.code = error_code(message)


@dataclass
class StreamPart:
    """One streamed response: a chunk of audio (with its sample rate) and/or the pipeline's other
    outputs that came with it (a text delta, ...), by name."""
    audio: np.ndarray | None = None
    sample_rate: int = 0
    outputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class StreamResult:
    chunks: list[np.ndarray] = field(default_factory=list)
    sample_rate: int = 0
    ttfa_s: float = float("nan")
    total_s: float = 0.0
    # When each chunk arrived, seconds after the request was sent (what a player would hear).
    arrivals_s: list[float] = field(default_factory=list)
    # The pipeline's outputs besides audio (a text answer's deltas), by name, in arrival order.
    outputs: dict[str, list[np.ndarray]] = field(default_factory=dict)

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)

    @property
    def audio_s(self) -> float:
        return sum(len(c) for c in self.chunks) / self.sample_rate if self.sample_rate else 0.0

    @property
    def rtf(self) -> float:
        return self.total_s / self.audio_s if self.audio_s else float("inf")

    @property
    def playback(self) -> Playback:
        """A player that starts at the first audio: its gaps and underrun (omni_backend/playback.py)."""
        rate = self.sample_rate or 1
        return playback_of((at, len(c) / rate) for at, c in zip(self.arrivals_s, self.chunks))


def _inputs(module, text: str, params: dict[str, Any] | None) -> list:
    """TEXT and PARAMS tensors, built before any stream opens: a request that cannot be encoded
    fails here with invalid_request (inside gRPC's request iterator it would only cancel the call)."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as e:   # a lone surrogate, e.g. from argv's surrogateescape
        raise TritonStreamError(f"invalid_request: text: contains an unpaired surrogate at character "
                                f"{e.start}; it is not encodable as UTF-8") from None
    except AttributeError:
        raise TritonStreamError(f"invalid_request: text: must be a string, got {type(text).__name__}") from None
    t = module.InferInput("TEXT", [1], "BYTES")
    t.set_data_from_numpy(np.array([data], dtype=np.object_))
    inputs = [t]
    if params is not None:
        try:
            # ensure_ascii: lone surrogates travel as \ud800 escapes and the server names the field.
            payload = json.dumps(params).encode()
        except (TypeError, ValueError) as e:
            raise TritonStreamError(f"invalid_request: params: cannot be sent as JSON ({e})") from None
        p = module.InferInput("PARAMS", [1], "BYTES")
        p.set_data_from_numpy(np.array([payload], dtype=np.object_))
        inputs.append(p)
    return inputs


def _control_inputs(module, command: str, text: str = "", params: dict[str, Any] | None = None) -> list:
    """TEXT/PARAMS plus CONTROL=`command`: a control request to an entry model."""
    control = module.InferInput("CONTROL", [1], "BYTES")
    control.set_data_from_numpy(np.array([command.encode()], dtype=np.object_))
    return [*_inputs(module, text, params), control]


def _error(error: Any) -> TritonStreamError:
    """A tritonclient error (an error response, or a failed gRPC call) as a coded error."""
    msg = error.message() if hasattr(error, "message") else str(error)
    msg = msg() if callable(msg) else msg
    status = error.status() if callable(getattr(error, "status", None)) else None
    return TritonStreamError(msg or str(error) or type(error).__name__, status)


def _parse(result: Any, error: Any) -> tuple[StreamPart | None, bool]:
    """One streamed response -> (its part, or None when it carries nothing, is it the final one)."""
    if error is not None:
        raise _error(error)
    response = result.get_response()
    part = StreamPart()
    for tensor in response.outputs:
        if tensor.name in ("AUDIO", "SAMPLE_RATE"):
            continue
        value = result.as_numpy(tensor.name)
        if value is not None and value.size:
            part.outputs[tensor.name] = value
    audio = result.as_numpy("AUDIO")
    if audio is not None and audio.size:
        part.audio, part.sample_rate = audio.reshape(-1), int(result.as_numpy("SAMPLE_RATE")[0])
    empty = part.audio is None and not part.outputs
    return (None if empty else part), response.parameters["triton_final_response"].bool_param


def stream(url: str, model: str, text: str, params: dict[str, Any] | None = None,
           timeout_s: float = 300.0, watch_s: float | None = WATCH_S) -> Iterator[tuple[np.ndarray, int]]:
    """Yield (audio chunk, sample rate) as they arrive; raises TritonStreamError. Responses
    without audio (a pipeline's text deltas) are skipped: `stream_parts` gives them. A stream
    silent for `watch_s` checks that the model is still ready, and ends with `unavailable:`
    when it is not (None: never checks)."""
    parts = stream_parts(url, model, text, params, timeout_s, watch_s)
    try:
        for part in parts:
            if part.audio is not None:
                yield part.audio, part.sample_rate
    finally:
        parts.close()


def stream_parts(url: str, model: str, text: str, params: dict[str, Any] | None = None,
                 timeout_s: float = 300.0, watch_s: float | None = WATCH_S) -> Iterator[StreamPart]:
    """Yield every response's part (audio and/or other outputs) in arrival order; raises
    TritonStreamError. Closing the generator early ends the request as `astream` does: a
    control request on the same stream asks the entry to end it (its id is made unique here),
    and the stream is cancelled only when that is refused or not done within 2 s."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    inputs = _inputs(grpcclient, text, params)
    request_id = f"stream-{uuid.uuid4().hex}"
    responses: "queue.Queue" = queue.Queue()
    try:
        client = grpcclient.InferenceServerClient(url)
    except InferenceServerException as e:   # e.g. an address gRPC cannot parse
        raise _error(e) from None
    complete = False
    unready = False   # the model was unloaded under the stream: nobody to ask to end it
    try:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        try:
            client.async_stream_infer(model, inputs, request_id=request_id, enable_empty_final_response=True)
        except InferenceServerException as e:
            # "The stream is no longer in valid state, the error detail is reported through
            # provided callback": the real failure (e.g. connection refused) is in the queue.
            try:
                _, error = responses.get(timeout=5.0)
            except queue.Empty:
                error = None
            raise _error(error if error is not None else e) from None
        while True:
            deadline = time.monotonic() + timeout_s
            while True:
                left = deadline - time.monotonic()
                try:
                    item = responses.get(timeout=max(0.0, min(left, watch_s or left)))
                    break
                except queue.Empty:
                    pass
                if left <= 0:
                    raise TritonStreamError(f"unavailable: no response from {url} within {timeout_s:g} s")
                if watch_s and not _still_ready(client, model):
                    unready = True
                    raise _not_ready(model)
            complete = item[1] is not None   # an error response ends the request
            part, final = _parse(*item)
            complete = final
            if part is not None:
                yield part
            if final:
                return
    except InferenceServerException as e:
        raise _error(e) from None
    finally:
        if not complete and not unready:
            complete = _ask_to_end(client, model, request_id, responses)
        # a complete request's stream is closed, not cancelled (see end_stream)
        client.stop_stream(cancel_requests=not complete)
        client.close()


def _still_ready(client: Any, model: str) -> bool:
    """False only when the server answers that `model` is not ready."""
    try:
        return bool(client.is_model_ready(model, client_timeout=WATCH_S))
    except Exception:  # noqa: BLE001 - unreachable or slow: the stream's own call tells
        return True


def _ask_to_end(client: Any, model: str, request_id: str, responses: "queue.Queue",
                timeout_s: float = 2.0) -> bool:
    """Send CONTROL=cancel for `request_id` on the open stream and wait for both requests' final
    responses (the stream's, then the cancel's); False when refused, failed or late."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    inputs = _control_inputs(grpcclient, "cancel", params={"request_id": request_id})
    try:
        client.async_stream_infer(model, inputs, request_id=f"{request_id}-cancel",
                                  enable_empty_final_response=True)
    except InferenceServerException:
        return False
    deadline = time.monotonic() + timeout_s
    finals = set()
    while finals != {request_id, f"{request_id}-cancel"}:
        try:
            result, error = responses.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return False
        if error is not None:
            return False
        response = result.get_response()
        if response.parameters["triton_final_response"].bool_param:
            finals.add(response.id)
    return True


def synthesize(url: str, model: str, text: str, params: dict[str, Any] | None = None) -> StreamResult:
    """Stream a whole request on a connection of its own, timing the first audio chunk (from
    before the connection opens); other outputs go to `outputs`."""
    t0 = time.perf_counter()
    return _collected(stream_parts(url, model, text, params), t0)


class StreamSession:
    """One gRPC connection and one open stream for requests made one after another, as a client
    that keeps its connection does (perf_analyzer, the speech API): a request's times then leave
    out opening a connection and a stream (about 1 ms on a 2-core host). Not for concurrent use:
    one session per client thread. A request that fails or is left unfinished closes the stream
    (and its queue), so no response of it reaches the next request, which opens another."""

    def __init__(self, url: str, timeout_s: float = 300.0):
        self.url, self.timeout_s = url, timeout_s
        self._client: Any = None
        self._responses: "queue.Queue" = queue.Queue()

    def _open(self) -> Any:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        if self._client is None:
            try:
                client = grpcclient.InferenceServerClient(self.url)
            except InferenceServerException as e:
                raise _error(e) from None
            self._responses = queue.Queue()
            client.start_stream(callback=lambda result, error, q=self._responses: q.put((result, error)))
            self._client = client
        return self._client

    def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            client.stop_stream(cancel_requests=True)
            client.close()

    def __enter__(self) -> "StreamSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def parts(self, model: str, text: str, params: dict[str, Any] | None = None) -> Iterator[StreamPart]:
        """Every response's part of one request, in arrival order; raises TritonStreamError."""
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        inputs = _inputs(grpcclient, text, params)
        request_id = f"stream-{uuid.uuid4().hex}"
        complete = False
        try:
            try:
                self._open().async_stream_infer(model, inputs, request_id=request_id,
                                                enable_empty_final_response=True)
            except InferenceServerException as e:
                raise _error(e) from None
            while True:
                try:
                    result, error = self._responses.get(timeout=self.timeout_s)
                except queue.Empty:
                    raise TritonStreamError(f"unavailable: no response from {self.url} within "
                                            f"{self.timeout_s:g} s") from None
                part, final = _parse(result, error)
                if part is not None:
                    yield part
                if final:
                    complete = True
                    return
        finally:
            if not complete:   # an error, or the caller stopped reading: this stream is done
                self.close()

    def synthesize(self, model: str, text: str, params: dict[str, Any] | None = None) -> StreamResult:
        """As `synthesize`, on this session's connection (timed from the request's send)."""
        t0 = time.perf_counter()
        return _collected(self.parts(model, text, params), t0)


def _collected(parts: Iterator[StreamPart], t0: float) -> StreamResult:
    """A whole stream's parts as a StreamResult, times taken from `t0`."""
    res = StreamResult()
    for part in parts:
        for name, value in part.outputs.items():
            res.outputs.setdefault(name, []).append(value)
        if part.audio is None:
            continue
        now = time.perf_counter() - t0
        if not res.chunks:
            res.ttfa_s = now
        res.arrivals_s.append(now)
        res.chunks.append(part.audio)
        res.sample_rate = part.sample_rate
    res.total_s = time.perf_counter() - t0
    return res


async def astream(client: Any, model: str, text: str, params: dict[str, Any] | None = None,
                  request_id: str = "", unique_id: bool = False,
                  watch_s: float | None = WATCH_S) -> AsyncIterator[tuple[np.ndarray, int]]:
    """Async variant over a shared `tritonclient.grpc.aio.InferenceServerClient`; (audio chunk,
    sample rate) as they arrive, skipping responses without audio (`astream_parts` gives them).

    Closing the generator early (client gone) ends the request in Triton, which frees the engine
    slot: a control request asks the entry model to end it when its request id is known to be
    unique (`unique_id`, or none given: one is made), otherwise the gRPC stream is cancelled.
    A stream silent for `watch_s` checks that the model is still ready (see `stream`).
    """
    parts = astream_parts(client, model, text, params, request_id, unique_id, watch_s)
    try:
        async for part in parts:
            if part.audio is not None:
                yield part.audio, part.sample_rate
    finally:
        await parts.aclose()


async def astream_parts(client: Any, model: str, text: str, params: dict[str, Any] | None = None,
                        request_id: str = "", unique_id: bool = False,
                        watch_s: float | None = WATCH_S) -> AsyncIterator[StreamPart]:
    """Every response's part (audio and/or other outputs) in arrival order; see `astream`."""
    import tritonclient.grpc.aio as aioclient

    inputs = _inputs(aioclient, text, params)
    if not request_id:
        request_id, unique_id = f"stream-{uuid.uuid4().hex}", True

    async def ask_to_end() -> None:
        await acontrol(client, model, "cancel", f"{request_id}-cancel", params={"request_id": request_id})

    responses = _open_call(client, model, inputs, request_id)
    complete = False   # the request is over: its final response, an error, the call's end
    failed = False     # the call itself failed: nobody to ask
    try:
        async for result, error in (_watched(responses, client, model, watch_s) if watch_s else responses):
            if error is not None:
                complete = True   # an error response ends the request
            part, final = _parse(result, error)
            complete = final
            if part is not None:
                yield part
            if final:
                return
        complete = True   # the call ended: nothing is left to end
    except asyncio.CancelledError:
        # ours (the consumer left): the request is asked to end below; grpc.aio's: nobody to ask
        failed = not cancelled_by_us()
        _raise_unless_ours("the gRPC stream to Triton was cancelled")
    except Exception:
        failed = True
        raise
    finally:
        # the consumer left a running request: ask the entry to end it, by its id, when no other
        # stream can have that id; otherwise (or when that fails) the call is cancelled
        await end_stream(responses, complete,
                         ask_to_end=ask_to_end if unique_id and not failed else None)


def _raise_unless_ours(what: str) -> None:
    """In an `except CancelledError`: re-raise our own cancellation; grpc.aio's is `unavailable:`."""
    if cancelled_by_us():
        raise
    raise TritonStreamError(f"unavailable: {what}") from None


async def uncancelled(call: Awaitable[Any], what: str = "a gRPC call to Triton was cancelled") -> Any:
    """`await call`, where a cancellation that is not this task's own (grpc.aio's) is a
    `TritonStreamError` (`unavailable:`): a task that ran `call` then ends failed, not cancelled,
    and whoever awaits it is told."""
    try:
        return await call
    except asyncio.CancelledError:
        _raise_unless_ours(what)


async def next_watched(it: AsyncIterator, every_s: float, check: Callable[[], Awaitable[None]]) -> Any:
    """`await it.__anext__()`, awaiting `check()` (which raises to give up) every `every_s` of
    waiting. The step is never left running: a step left running keeps its source busy, so the
    stream's own close could not end it."""
    pending = asyncio.ensure_future(it.__anext__())
    try:
        while not (await asyncio.wait({pending}, timeout=every_s))[0]:
            await check()
        return pending.result()
    finally:
        if not pending.done():   # given up, or this task was cancelled (the caller left)
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        elif not pending.cancelled():
            # the step ended (often with StopAsyncIteration) just as this task was cancelled:
            # its outcome has no reader now; marked read, asyncio logs nothing
            pending.exception()
        # a raised outcome's traceback holds this frame: without the step in it, no reference
        # cycle keeps the stream until a full collection (omni_backend/triton/stream_waits.py)
        del pending


async def _watched(responses: Any, client: Any, model: str, watch_s: float) -> AsyncIterator[Any]:
    """`responses`, but a wait longer than `watch_s` asks whether `model` is still ready and
    raises `unavailable:` when the server says it is not."""
    async def still_ready() -> None:
        try:
            ready = await asyncio.wait_for(client.is_model_ready(model), watch_s)
        except Exception:  # noqa: BLE001 - unreachable or slow: the call itself tells
            return
        if not ready:
            raise _not_ready(model)
    it = responses.__aiter__()
    while True:
        try:
            item = await next_watched(it, watch_s, still_ready)
        except StopAsyncIteration:
            return
        yield item


def _open_call(client: Any, model: str, inputs: list, request_id: str) -> Any:
    """A `stream_infer` call that sends one request (then half-closes) and asks for the final response."""
    from tritonclient.utils import InferenceServerException

    async def requests():
        yield {"model_name": model, "inputs": inputs, "request_id": request_id, "parameters": EMPTY_FINAL}

    try:
        return client.stream_infer(inputs_iterator=requests())
    except InferenceServerException as e:
        raise _error(e) from None


async def acontrol(client: Any, model: str, command: str, request_id: str, text: str = "",
                   params: dict[str, Any] | None = None) -> None:
    """One CONTROL request to an entry model (`append`, `cancel`, ...), on a call of its own;
    returns once it is answered, raises its error as a `TritonStreamError`."""
    import tritonclient.grpc.aio as aioclient

    responses = _open_call(client, model, _control_inputs(aioclient, command, text, params), request_id)
    complete = False
    try:
        async for result, error in responses:
            if error is not None:
                complete = True   # the answer: an error ends the request
                raise _error(error)
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
        complete = True
    except asyncio.CancelledError:
        _raise_unless_ours("the gRPC call to Triton was cancelled")
    finally:
        await end_stream(responses, complete)
