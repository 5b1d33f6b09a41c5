"""Streaming BLS calls from the entry model to decoupled stage models.

Every call here gets exactly one response: a stage's stream is read one response per call
(`CONTROL=open`, then `CONTROL=pull`; omni_backend/triton/pulled_stream.py says why). The calls
block, so they run on the model's thread pool, never on the event loop. Triton 2.51 cannot cancel
a BLS call from the caller's side, so cancellation travels as a control request (`CONTROL=cancel`
with the same REQUEST_ID) that makes the stage end that stream and answer a pull in flight. Text
for a running stream travels the same way (`CONTROL=append`, omni_backend/triton/text_input.py).
"""
from __future__ import annotations

import asyncio
import json
from concurrent.futures import Executor
from typing import AsyncIterator

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backend.errors import PipelineError, error_code, with_code
from omni_backend.stubs.server_stubs import since_boot
from omni_backend.triton.decoupled import bytes_tensor
from omni_backend.triton.stage_liveness import StageLiveness
from omni_backend.triton.stream_waits import drop_result
from omni_backend.stubs.unhealthy_stub import kill_unhealthy_stub


class StageFailed(PipelineError):
    """An upstream stage answered with an error; its message keeps its own code. Triton's own
    failures (a dead stub, a model being reloaded) get one, naming the stage."""

    @classmethod
    def of(cls, response, model_name: str, called_at: float) -> "StageFailed":
        """The error of a stage's answer to a call made at `called_at` (stubs.since_boot()). A stub
        Triton gave up on as "not healthy" is killed first, before it runs again and takes the
        call Triton has freed (omni_backend/stubs/unhealthy_stub.py)."""
        message = response.error().message()
        killed = kill_unhealthy_stub(message, model_name, called_at)
        if killed:
            pb_utils.Logger.log_warn(f"{model_name}: killed stub {', '.join(str(s.pid) for s in killed)}: "
                                     f"Triton answered a call to it with: {message}")
        return cls(message, model_name)

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
    called_at = since_boot()
    response = request.exec()
    if response.has_error():
        raise StageFailed.of(response, model_name, called_at)
    return _outputs(response, outputs)


def cancel_stage_request(model_name: str, request_id: str) -> None:
    """Ask a stage to end the stream with this request id (blocking; run in a thread)."""
    inputs = [bytes_tensor("REQUEST_ID", request_id), bytes_tensor("CONTROL", "cancel")]
    called_at = since_boot()
    for resp in _start(model_name, inputs, [], f"{request_id}-cancel"):
        if resp.has_error():   # the stream is gone anyway; a stub Triton gave up on is not
            StageFailed.of(resp, model_name, called_at)


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
    _one_response(model_name, inputs, [], f"{request_id}-append")


def ping_stage(model_name: str, request_id: str) -> None:
    """Ask a decoupled stage whether it answers (blocking; raises StageFailed)."""
    inputs = [bytes_tensor("REQUEST_ID", request_id), bytes_tensor("CONTROL", "ping")]
    _one_response(model_name, inputs, [], request_id)


class StageStream:
    """One stream on a stage, an async iterator of {output name: numpy array}.

    Read one response per BLS call (omni_backend/triton/pulled_stream.py says why): `CONTROL=open`
    with the inputs answers with the first response, each `CONTROL=pull` with the next; a
    response without outputs is the end."""

    def __init__(self, executor: Executor, model_name: str, request_id: str,
                 inputs: list["pb_utils.Tensor"], outputs: list[str], liveness: StageLiveness | None = None):
        self.executor = executor
        self.liveness = liveness
        self.model_name = model_name
        self.request_id = request_id
        self.inputs = inputs
        self.outputs = outputs
        self._done = False
        self._starting: asyncio.Future | None = None  # the in-flight open, answered with the first response
        self._pending: asyncio.Future | None = None   # the in-flight pull
        self._opened = asyncio.Event()                 # the stage has the request (or opening failed)

    async def __aiter__(self) -> AsyncIterator[dict[str, np.ndarray]]:
        loop = asyncio.get_running_loop()
        # Shielded: cancelling the reader must not cancel these futures. A cancelled executor
        # future is done at once while its thread still waits for the stage's answer, and aclose()
        # must know when that call is over.
        self._starting = loop.run_in_executor(self.executor, self._open, loop)
        self._starting.add_done_callback(drop_result)   # read below, or abandoned by a cancelled reader
        try:
            resp = await asyncio.shield(self._starting)
        finally:
            self._opened.set()
        while True:
            if self._done:  # aclose() took over
                return
            if self.liveness is not None:
                self.liveness.answered(self.model_name)
            out = _outputs(resp, self.outputs)
            if not out:
                self._done = True
                return
            if ERROR_OUTPUT in out:
                self._done = True
                self.executor.submit(_pull_quietly, self.model_name, self.request_id, self.outputs)   # its end
                message = out[ERROR_OUTPUT].reshape(-1)[0]
                raise StageFailed(message.decode(errors="replace") if isinstance(message, bytes) else str(message),
                                  self.model_name)
            # the next pull travels while this response is used: a response the stage makes
            # meanwhile is answered at once, as a streamed one would leave
            self._pending = loop.run_in_executor(self.executor, _pull, self.model_name, self.request_id, self.outputs)
            self._pending.add_done_callback(drop_result)   # read below, or abandoned by aclose()
            yield out
            if self._done:
                return
            try:
                resp = await asyncio.shield(self._pending)
            except Exception:
                if self._done:   # aclose() stopped the stream before this pull reached the stage
                    return
                raise
            self._pending = None

    def _open(self, loop: asyncio.AbstractEventLoop):
        # The open may be answered only with the stream's first response, which can depend on text
        # still to be appended: `opened` is signalled as the request goes out, not when it returns.
        loop.call_soon_threadsafe(self._opened.set)
        return _one_response(self.model_name, [*self.inputs, bytes_tensor("CONTROL", "open")], self.outputs,
                             self.request_id)

    async def opened(self) -> None:
        """Return once the request is on its way to the stage (a control message for it, such as
        appended text, sent later waits there for it to arrive), or opening it failed."""
        await self._opened.wait()

    async def append_text(self, text: str, end: bool) -> None:
        """More text for the stream (`end`: the text is complete); raises the stage's error."""
        await self.opened()
        await asyncio.get_running_loop().run_in_executor(self.executor, append_stage_text, self.model_name,
                                                         self.request_id, text, end)

    async def append_inputs(self, inputs: list, end: bool) -> None:
        """More of the stream's declared input tensors (`end`: the source ended)."""
        await self.opened()
        await asyncio.get_running_loop().run_in_executor(self.executor, append_stage_inputs, self.model_name,
                                                         self.request_id, inputs, end)

    async def aclose(self) -> None:
        """Stop the stage's stream if it is still running. A stream whose opening call is still in
        flight (the client left right after asking) is stopped as soon as the request is on its
        way; a call in flight is waited for (the stop answers it)."""
        if self._done or self._starting is None:
            self._done = True
            return
        self._done = True
        loop = asyncio.get_running_loop()
        if not self._starting.done():
            await self._opened.wait()
        await loop.run_in_executor(self.executor, cancel_stage_request, self.model_name, self.request_id)
        await asyncio.wait({f for f in (self._starting, self._pending) if f is not None})


def _one_response(model_name: str, inputs: list, outputs: list[str], request_id: str):
    """A call to a stream stage answered with one response (raises StageFailed with Triton's error)."""
    called_at = since_boot()
    responses = list(_start(model_name, inputs, outputs, request_id))
    for resp in responses:
        if resp.has_error():
            raise StageFailed.of(resp, model_name, called_at)
    return responses[0]


def _pull(model_name: str, request_id: str, outputs: list[str]):
    inputs = [bytes_tensor("REQUEST_ID", request_id), bytes_tensor("CONTROL", "pull")]
    return _one_response(model_name, inputs, outputs, f"{request_id}-pull")


def _pull_quietly(model_name: str, request_id: str, outputs: list[str]) -> None:
    try:
        _pull(model_name, request_id, outputs)
    except Exception:  # the stream is over; its end has no reader
        pass
