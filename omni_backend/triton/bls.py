"""Streaming BLS calls from the entry model to decoupled stage models.

`InferenceRequest.exec(decoupled=True)` returns an iterator whose `next()` blocks, so it is
pulled from the model's thread pool, never on the event loop. Triton 2.51 cannot cancel a BLS
stream from the caller's side, so cancellation travels as a control request (`CONTROL=cancel`
with the same REQUEST_ID) that makes the stage end that stream; the rest of the stream is then
drained so nothing is left in shared memory. Text for a running stream travels the same way
(`CONTROL=append`, omni_backend/triton/text_input.py).
"""
from __future__ import annotations

import asyncio
import json
from concurrent.futures import Executor
from typing import AsyncIterator

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backend.errors import PipelineError, error_code, with_code
from omni_backend.triton.decoupled import bytes_tensor
from omni_backend.triton.stage_liveness import StageLiveness


class StageFailed(PipelineError):
    """An upstream stage answered with an error; its message keeps its own code. Triton's own
    failures (a dead stub, a model being reloaded) get one, naming the stage."""

    def __init__(self, message: str, model_name: str = ""):
        if with_code(message) != message:  # Triton's own text: code it and name the stage
            message = f"{error_code(message)}: {model_name or 'stage'}: {message}"
        Exception.__init__(self, message)
        self.code = error_code(message)


# A stream stage's error as data (see stage.StageModel.error_response): a caller raises it.
ERROR_OUTPUT = "ERROR"


def _start(model_name: str, inputs: list, outputs: list[str], request_id: str):
    req = pb_utils.InferenceRequest(model_name=model_name, inputs=inputs,
                                    requested_output_names=outputs, request_id=request_id)
    return req.exec(decoupled=True)


def _outputs(response, names: list[str]) -> dict[str, np.ndarray]:
    out = {}
    for name in names:
        t = pb_utils.get_output_tensor_by_name(response, name)
        if t is not None:
            out[name] = t.as_numpy().copy()
    return out


def call_stage(model_name: str, inputs: list, outputs: list[str], request_id: str) -> dict[str, np.ndarray]:
    """One request to a non-decoupled (batched) stage, one answer (blocking; raises StageFailed)."""
    request = pb_utils.InferenceRequest(model_name=model_name, requested_output_names=outputs,
                                        request_id=request_id, inputs=inputs)
    response = request.exec()
    if response.has_error():
        raise StageFailed(response.error().message(), model_name)
    return _outputs(response, outputs)


def _drain(it) -> None:
    for _ in it:
        pass


def cancel_stage_request(model_name: str, request_id: str) -> None:
    """Ask a stage to end the stream with this request id (blocking; run in a thread)."""
    inputs = [bytes_tensor("REQUEST_ID", request_id), bytes_tensor("CONTROL", "cancel")]
    _drain(_start(model_name, inputs, [], f"{request_id}-cancel"))


def append_stage_text(model_name: str, request_id: str, text: str, end: bool) -> None:
    """Give the stream with this request id more text (`end`: its input is complete); blocking,
    raises StageFailed with the stage's error."""
    _append(model_name, request_id, {"text": text, "end": end}, [])


def append_stage_inputs(model_name: str, request_id: str, tensors: list, end: bool) -> None:
    """Give the stream with this request id more of its declared input tensors (a source stage's
    next chunk; `end`: the source ended); blocking, raises StageFailed with the stage's error."""
    _append(model_name, request_id, {"end": end}, tensors)


def _append(model_name: str, request_id: str, fields: dict, tensors: list) -> None:
    inputs = [bytes_tensor("REQUEST_ID", request_id), bytes_tensor("CONTROL", "append"),
              bytes_tensor("REQUEST", json.dumps(fields)), *tensors]
    for resp in _start(model_name, inputs, [], f"{request_id}-append"):
        if resp.has_error():
            raise StageFailed(resp.error().message(), model_name)


def ping_stage(model_name: str, request_id: str) -> None:
    """Ask a decoupled stage whether it answers (blocking; raises StageFailed)."""
    inputs = [bytes_tensor("REQUEST_ID", request_id), bytes_tensor("CONTROL", "ping")]
    for resp in _start(model_name, inputs, [], request_id):
        if resp.has_error():
            raise StageFailed(resp.error().message(), model_name)


class StageStream:
    """One streaming call to a stage; an async iterator of {output name: numpy array}."""

    def __init__(self, executor: Executor, model_name: str, request_id: str,
                 inputs: list["pb_utils.Tensor"], outputs: list[str], liveness: StageLiveness | None = None):
        self.executor = executor
        self.liveness = liveness
        self.model_name = model_name
        self.request_id = request_id
        self.inputs = inputs
        self.outputs = outputs
        self._it = None
        self._done = False
        self._starting: asyncio.Future | None = None  # the in-flight exec() that opens the stream
        self._pending: asyncio.Future | None = None   # the in-flight next() on the iterator
        self._opened = asyncio.Event()                 # the stage has the request (or opening failed)

    async def __aiter__(self) -> AsyncIterator[dict[str, np.ndarray]]:
        loop = asyncio.get_running_loop()
        # Shielded: cancelling the reader must not cancel these futures. A cancelled executor
        # future is done at once while its thread still runs `next()`, and aclose() would then
        # drain the iterator from a second thread (two threads on one BLS iterator stalled a
        # whole entry process for 20 s under overload).
        self._starting = loop.run_in_executor(self.executor, self._open, loop)
        try:
            self._it = await asyncio.shield(self._starting)
        finally:
            self._opened.set()
        while True:
            if self._done:  # aclose() took over the iterator while it was being opened
                return
            self._pending = loop.run_in_executor(self.executor, next, self._it, None)
            resp = await asyncio.shield(self._pending)
            self._pending = None
            if self.liveness is not None and resp is not None:
                self.liveness.answered(self.model_name)
            if self._done:  # aclose() took over the iterator
                return
            if resp is None:
                self._done = True
                return
            if resp.has_error():
                self._done = True
                _drain_quietly(self._it)
                raise StageFailed(resp.error().message(), self.model_name)
            out = _outputs(resp, self.outputs)
            if ERROR_OUTPUT in out:
                self._done = True
                _drain_quietly(self._it)
                message = out[ERROR_OUTPUT].reshape(-1)[0]
                raise StageFailed(message.decode(errors="replace") if isinstance(message, bytes) else str(message),
                                  self.model_name)
            if out:
                yield out

    def _open(self, loop: asyncio.AbstractEventLoop):
        # exec() may return only with the stream's first response, which can depend on text still
        # to be appended: `opened` is signalled as the request goes out, not when exec() returns.
        loop.call_soon_threadsafe(self._opened.set)
        return _start(self.model_name, self.inputs, self.outputs, self.request_id)

    async def opened(self) -> None:
        """Return once the request is on its way to the stage (a control message for it, such as
        appended text, sent later waits there for it to arrive), or opening it failed."""
        await self._opened.wait()

    async def aclose(self) -> None:
        """Stop the stage's stream if it is still running and drain what is left. A stream
        whose opening call is still in flight (the client left right after asking) is waited
        for, then stopped and drained too: left alone, its responses would never be read."""
        if self._done or self._starting is None:
            self._done = True
            return
        self._done = True
        loop = asyncio.get_running_loop()
        cancelled = False
        if not self._starting.done():
            # exec() returns with the stage's first response, which may wait for input that now
            # never comes (appended text or tokens): cancel as soon as the request is on its way
            await self._opened.wait()
            await loop.run_in_executor(self.executor, cancel_stage_request, self.model_name, self.request_id)
            cancelled = True
        try:
            it = await asyncio.shield(self._starting)
        except Exception:  # the stream never opened: nothing to stop
            return
        if not cancelled:
            await loop.run_in_executor(self.executor, cancel_stage_request, self.model_name, self.request_id)
        if self._pending is not None:  # never two threads on one iterator
            await asyncio.wait({self._pending})
        await loop.run_in_executor(self.executor, _drain_quietly, it)


def _drain_quietly(it) -> None:
    try:
        _drain(it)
    except Exception:  # the stream is being abandoned; its errors have no reader
        pass
