"""Base class for stream stages (decoupled), called by the entry model or a transfer over BLS.

Inputs: REQUEST (JSON: the adapter's normalized request; stages fed by the client's request),
the stage's declared tensors (stages fed by other stages: codes, hidden states), REQUEST_ID, and
CONTROL for out-of-band messages: `cancel` ends the stream with that REQUEST_ID (see bls.py for
why; one that comes before its stream ends the stream as it arrives), `ping` answers at once (liveness),
`open` starts a stream whose caller pulls each later response with `pull` and the same REQUEST_ID
(how the entry reads stages: omni_backend/triton/pulled_stream.py), `append` gives the stream with that REQUEST_ID more text
(REQUEST: `{"text": "...", "end": bool}`; a stage that reads text as it arrives implements
`on_append`, see omni_backend/triton/text_input.py) or, from a transfer, more of its declared
input tensors (REQUEST: `{"end": bool}` and the tensors; `on_append_inputs`).
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backend.errors import InvalidRequest, PipelineError
from omni_backend.families import built_model
from omni_backend.triton.bls import ERROR_OUTPUT
from omni_backend.triton.decoupled import FINAL, DecoupledModel, StreamContext, bytes_tensor, input_bytes
from omni_backend.triton.metrics import LoopGauge, StageMetrics
from omni_backend.triton.pulled_stream import UNCLAIMED_S, PulledStream
from omni_backend.triton.text_input import TARGET_WAIT_S, parse_stage_append


class StageModel(DecoupledModel):
    def setup(self) -> None:
        built = built_model(self.parameters, self.model_name)
        self.pipeline, self.deploy, self.model_path = built.pipeline, built.deploy, built.model_path
        self.stage_id = int(self.parameters["stage_id"])
        self.stage_config = self.pipeline.stages[self.stage_id]
        self.stage_deploy = self.deploy.stage(self.stage_id)
        # read over BLS: a stage that declares an ERROR output sends its errors in it (see error_response)
        self.error_before_final = any(t.name == ERROR_OUTPUT for t in self.stage_config.outputs)
        self.by_request_id: dict[str, StreamContext] = {}
        # cancels that came before their stream (a caller that left while its request was on the
        # way): request id -> when; the stream is cancelled as it arrives
        self.early_cancels: dict[str, float] = {}
        # streams opened with CONTROL=open, by request id, until their end is pulled
        self.pulled: dict[str, PulledStream] = {}
        self.metrics = StageMetrics(self.model_name)
        self.streams_gauge = LoopGauge(self.metrics.active, lambda: len(self.by_request_id), self.loop)
        self.load()

    def load(self) -> None:
        """Load weights / engines; override."""

    def error_response(self, message: str) -> "pb_utils.InferenceResponse":
        """A stage that declares an `ERROR` output (STRING) sends its errors in it: the only way
        the message reaches a BLS caller in 2.51 (bls.StageStream raises it there)."""
        if self.error_before_final:
            return pb_utils.InferenceResponse(output_tensors=[bytes_tensor(ERROR_OUTPUT, message)])
        return super().error_response(message)

    async def generate(self, ctx: StreamContext, request: dict[str, Any] | None,
                       inputs: dict[str, np.ndarray]) -> AsyncIterator[list["pb_utils.Tensor"]]:
        """The stage's responses for one request: `request` is the client's normalized request
        (stages fed by it), `inputs` the declared tensors that came with it."""
        raise NotImplementedError
        yield  # pragma: no cover

    async def _dispatch(self, request: "pb_utils.InferenceRequest") -> None:
        command = self.command(request)
        if command == "open":
            await self._open(request)
        elif command == "pull":
            self._pull(request)
        else:
            await super()._dispatch(request)

    async def _open(self, request: "pb_utils.InferenceRequest") -> None:
        """A stream whose first response answers this request and each later one a `pull`."""
        self._forget_unclaimed()
        rid = _request_id(request)
        stream = PulledStream(request.get_response_sender(), self.responses)
        self.pulled[rid] = stream
        try:
            await self._serve(request, stream)
        finally:
            if stream.finished and self.pulled.get(rid) is stream:
                del self.pulled[rid]

    def _pull(self, request: "pb_utils.InferenceRequest") -> None:
        rid = _request_id(request)
        stream = self.pulled.get(rid)
        if stream is None:
            error = InvalidRequest("REQUEST_ID", f"{self.model_name} has no open stream {rid!r} to pull from")
            # answered like any control message's error (a Triton error: it is the call's only response)
            self.responses.send(request.get_response_sender(), DecoupledModel.error_response(self, str(error)), FINAL)
            return
        stream.pull(request.get_response_sender())
        if stream.finished:
            del self.pulled[rid]

    def _forget_unclaimed(self) -> None:
        """Streams whose caller stopped pulling (an entry that died) are stopped and forgotten."""
        for rid, stream in list(self.pulled.items()):
            if stream.finished:
                del self.pulled[rid]
            elif stream.unclaimed_for() > UNCLAIMED_S:
                self._cancel(rid)

    def _cancel(self, rid: str) -> bool:
        """End the stream with this request id and whatever its caller still waits for; False
        when no such stream runs."""
        stream = self.pulled.pop(rid, None)
        if stream is not None:
            stream.close()
        target = self.by_request_id.get(rid)
        if target is None:
            return False
        target.cancel()
        self.on_cancel(target)
        return True

    async def control(self, request: "pb_utils.InferenceRequest", command: str) -> None:
        if command not in ("cancel", "append"):
            return await super().control(request, command)
        rid = _request_id(request)
        if command == "append":
            text, end = parse_stage_append(input_bytes(request, "REQUEST"))
            inputs = self._inputs(request, required=False)
            if inputs and text:
                raise InvalidRequest("REQUEST", "an append carries text or input tensors, not both")
            await self.append(rid, text, inputs, end)
            return
        if self._cancel(rid):
            return
        now = time.monotonic()
        for old, when in list(self.early_cancels.items()):   # a stream that never came is forgotten
            if now - when > 2 * TARGET_WAIT_S:
                del self.early_cancels[old]
        self.early_cancels[rid] = now

    async def append(self, rid: str, text: str, inputs: dict[str, np.ndarray], end: bool) -> None:
        """More text (or, with `inputs`, input tensors) for the stream with request id `rid`, which
        may still be on its way here."""
        target = self.by_request_id.get(rid)
        deadline = time.monotonic() + TARGET_WAIT_S
        while target is None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
            target = self.by_request_id.get(rid)
        if target is None or target.cancelled():
            raise InvalidRequest("REQUEST_ID", f"{self.model_name} has no open stream {rid!r} to append to")
        if inputs:
            await self.on_append_inputs(target, inputs, end)
        else:
            await self.on_append(target, text, end)

    async def on_append(self, ctx: StreamContext, text: str, end: bool) -> None:
        """More text for a running stream (`end`: its input is complete); raise InvalidRequest to
        refuse it. Stages that read text as it arrives override this."""
        raise InvalidRequest("CONTROL", f"{self.model_name} takes no text while a stream runs")

    async def on_append_inputs(self, ctx: StreamContext, inputs: dict[str, np.ndarray], end: bool) -> None:
        """More of a running stream's declared input tensors (a transfer streaming a source
        stage's output in chunks, `StageCall.append`; `end`: the source ended); raise
        InvalidRequest to refuse them. Stages fed that way override this."""
        raise InvalidRequest("CONTROL", f"{self.model_name} takes no inputs while a stream runs")

    def _inputs(self, request: "pb_utils.InferenceRequest", required: bool) -> dict[str, np.ndarray]:
        """The stage's declared input tensors that came with a request."""
        inputs = {}
        for spec in self.stage_config.inputs:
            t = pb_utils.get_input_tensor_by_name(request, spec.name)
            if t is not None:
                inputs[spec.name] = t.as_numpy()
            elif required and not spec.optional:
                raise InvalidRequest(spec.name, "required input is missing")
        return inputs

    def _request(self, ctx: StreamContext) -> dict[str, Any] | None:
        raw = input_bytes(ctx.request, "REQUEST")
        if raw is None:
            if self.stage_config.takes_request:
                raise InvalidRequest("REQUEST", "required: this stage is fed the client's request")
            return None
        try:
            request = json.loads(raw)
        except ValueError:
            raise InvalidRequest("REQUEST", "stage input must be a JSON object") from None
        if not isinstance(request, dict):
            raise InvalidRequest("REQUEST", "stage input must be a JSON object")
        return request

    async def stream(self, ctx: StreamContext) -> AsyncIterator[list["pb_utils.Tensor"]]:
        rid = (input_bytes(ctx.request, "REQUEST_ID") or b"").decode() or ctx.request_id
        async for tensors in self.open_stream(ctx, rid, self._request(ctx), self._inputs(ctx.request, required=True)):
            yield tensors

    async def open_stream(self, ctx: StreamContext, rid: str, request: dict[str, Any] | None,
                          inputs: dict[str, np.ndarray]) -> AsyncIterator[list["pb_utils.Tensor"]]:
        """One stream, its request already read: over Triton (`stream`) or in the entry's process
        (omni_backend/triton/local_stage.py)."""
        ctx.stage_request_id = rid
        self.by_request_id[rid] = ctx
        if self.early_cancels.pop(rid, None) is not None:
            ctx.cancel()
        self.streams_gauge.changed()
        try:
            async for tensors in self.generate(ctx, request, inputs):
                yield tensors
        finally:
            self.by_request_id.pop(rid, None)
            self.streams_gauge.changed()

    def on_cancel(self, ctx: StreamContext) -> None:
        """A stream was cancelled by its caller; engines free their slot here."""

    async def engine_events(self, ctx: StreamContext, stream) -> AsyncIterator[Any]:
        """The events of one engine request (an AR engine's FrameStream) up to its last, awaited
        while watching for the caller leaving; an engine error ends the stream with it."""
        iterator = stream.__aiter__()
        while True:
            try:
                event = await self.wait(ctx, iterator.__anext__())
            except StopAsyncIteration:
                return
            if event.finish_reason == "error":
                raise PipelineError(f"engine: {event.error}")
            yield event
            if event.finished:
                return


def _request_id(request: "pb_utils.InferenceRequest") -> str:
    return (input_bytes(request, "REQUEST_ID") or b"").decode() or (request.request_id() or "")


class ForgetOnRelease:
    """A stream resource (`ctx.resources`) that drops the stream's entry from a per-stream dict of
    its stage (text or token feeds) when the stream is released."""

    def __init__(self, entries: dict, key: str):
        self.entries, self.key = entries, key

    async def aclose(self) -> None:
        self.entries.pop(self.key, None)
