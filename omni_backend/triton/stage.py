"""Base class for stream stages (decoupled), called by the entry model or a transfer over BLS.

Inputs: REQUEST (JSON: the adapter's normalized request; stages fed by the client's request),
the stage's declared tensors (stages fed by other stages: codes, hidden states), REQUEST_ID, and
CONTROL for out-of-band messages: `cancel` ends the stream with that REQUEST_ID (see bls.py for
why), `ping` answers at once (liveness).
"""
from __future__ import annotations

import json
from typing import Any, AsyncIterator

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backend.errors import InvalidRequest
from omni_backend.families import built_model
from omni_backend.triton.decoupled import DecoupledModel, StreamContext, input_bytes
from omni_backend.triton.metrics import StageMetrics


class StageModel(DecoupledModel):
    def setup(self) -> None:
        built = built_model(self.parameters, self.model_name)
        self.pipeline, self.deploy, self.model_path = built.pipeline, built.deploy, built.model_path
        self.stage_id = int(self.parameters["stage_id"])
        self.stage_config = self.pipeline.stages[self.stage_id]
        self.stage_deploy = self.deploy.stage(self.stage_id)
        self.by_request_id: dict[str, StreamContext] = {}
        self.metrics = StageMetrics(self.model_name)
        self.metrics.active.set(0)   # a reloaded stage starts from the truth, not the dead one's count
        self.load()

    def load(self) -> None:
        """Load weights / engines; override."""

    async def generate(self, ctx: StreamContext, request: dict[str, Any] | None,
                       inputs: dict[str, np.ndarray]) -> AsyncIterator[list["pb_utils.Tensor"]]:
        """The stage's responses for one request: `request` is the client's normalized request
        (stages fed by it), `inputs` the declared tensors that came with it."""
        raise NotImplementedError
        yield  # pragma: no cover

    async def control(self, request: "pb_utils.InferenceRequest", command: str) -> None:
        if command != "cancel":
            return await super().control(request, command)
        rid = (input_bytes(request, "REQUEST_ID") or b"").decode() or (request.request_id() or "")
        target = self.by_request_id.get(rid)
        if target is not None:
            target.cancel()
            self.on_cancel(target)

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
        request = self._request(ctx)
        inputs = {}
        for spec in self.stage_config.inputs:
            t = pb_utils.get_input_tensor_by_name(ctx.request, spec.name)
            if t is not None:
                inputs[spec.name] = t.as_numpy()
            elif not spec.optional:
                raise InvalidRequest(spec.name, "required input is missing")
        ctx.stage_request_id = rid
        self.by_request_id[rid] = ctx
        self.metrics.active.set(len(self.by_request_id))
        try:
            async for tensors in self.generate(ctx, request, inputs):
                yield tensors
        finally:
            self.by_request_id.pop(rid, None)
            self.metrics.active.set(len(self.by_request_id))

    def on_cancel(self, ctx: StreamContext) -> None:
        """A stream was cancelled by its caller; engines free their slot here."""
