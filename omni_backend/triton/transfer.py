"""Edges of the stage graph: how one stage's stream becomes the next stage's requests.

A fed stage (one with `input_sources`, omni_backend/pipeline.py) names a `Transfer` class owned by
its model family. For each client request the entry model calls `Transfer.run` with the client's
normalized request, the source stages' output streams and a `StageCall` for the fed stage; what
`run` yields is the fed stage's output stream. A transfer may open one stream on a stream stage
and hand it the source's output chunk by chunk while it runs (`StageCall.append`: tokens or
hidden states), or make many calls to a batched stage (codec windows); it
awaits through `StageCall.wait` so a client that leaves stops it at once. A `StageCall` reaches
the stages through its host (omni_backend/triton/stage_host.py), never through the entry itself.
"""
from __future__ import annotations

import asyncio
import json
import uuid
from typing import TYPE_CHECKING, Any, AsyncIterator

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backend.deploy import DeployConfig
from omni_backend.pipeline import PipelineConfig, StageConfig, TensorSpec
from omni_backend.triton.bls import StageStream, call_stage
from omni_backend.triton.decoupled import StreamContext, bytes_tensor
from omni_backend.triton.stage_host import StageHost

if TYPE_CHECKING:
    from omni_backend.triton.local_stage import LocalStageStream

Outputs = dict[str, np.ndarray]


def stage_tensor(spec: TensorSpec, value: Any) -> "pb_utils.Tensor":
    """A value as the stage input `spec` declares it."""
    if spec.dtype == "STRING" and isinstance(value, (str, bytes)):
        return bytes_tensor(spec.name, value)
    return pb_utils.Tensor(spec.name, np.ascontiguousarray(value, dtype=spec.numpy_dtype))


class StageCall:
    """One client request's access to one stage: streams (stream stages), calls (batched
    stages), each named `<request id>-<n>` so its traces line up."""

    def __init__(self, host: StageHost, ctx: StreamContext, stage: StageConfig, model_name: str):
        self.host = host
        self.ctx = ctx
        self.stage = stage
        self.model_name = model_name
        self.request_id = f"{ctx.request_id or 'req'}-{uuid.uuid4().hex[:12]}"
        self._specs = {t.name: t for t in stage.inputs}
        self._calls = 0

    def _inputs(self, tensors: dict[str, Any]) -> list["pb_utils.Tensor"]:
        unknown = set(tensors) - set(self._specs)
        if unknown:
            raise ValueError(f"{self.model_name} declares no inputs {sorted(unknown)}")
        return [stage_tensor(self._specs[name], value) for name, value in tensors.items()]

    def stream(self, tensors: dict[str, Any] | None = None,
               request: dict[str, Any] | None = None) -> "StageStream | LocalStageStream":
        """Open a stream on a stream stage (over BLS, or in this process for a stage deployed
        with `process: entry`); closed with the client's request at the latest."""
        inputs = self._inputs(tensors or {})
        rid = self.request_id if self._calls == 0 else f"{self.request_id}-{self._calls}"
        self._calls += 1
        local = self.host.local_stages.get(self.stage.stage_id)
        if local is not None:
            stream = local.stream(self.ctx, rid, request, {t.name(): t.as_numpy() for t in inputs})
            self.ctx.resources.append(stream)
            return stream
        if request is not None:
            inputs.append(bytes_tensor("REQUEST", json.dumps(request)))
        stream = StageStream(self.host.executor, self.model_name, rid, [*inputs, bytes_tensor("REQUEST_ID", rid)],
                             [t.name for t in self.stage.outputs], self.host.liveness)
        self.ctx.resources.append(stream)
        return stream

    async def append(self, stream: "StageStream | LocalStageStream", tensors: dict[str, Any], end: bool = False) -> None:
        """More input tensors for a stream this call opened (the source's next chunk; `end`: the
        source ended). Await each append before the next: they arrive in order."""
        inputs = self._inputs(tensors)
        await self.wait(stream.opened())
        await self.wait(stream.append_inputs(inputs, end))

    async def call(self, tensors: dict[str, Any]) -> Outputs:
        """One request to a batched stage, one answer."""
        rid = f"{self.request_id}-w{self._calls}"
        self._calls += 1
        out = await self.wait(self.host.run_blocking(
            call_stage, self.model_name, self._inputs(tensors), [t.name for t in self.stage.outputs], rid))
        self.host.liveness.answered(self.model_name)
        return out

    async def wait(self, awaitable):
        """Await while watching for the client going away (then Cancelled is raised)."""
        return await self.host.wait(self.ctx, awaitable)


class Transfer:
    """A family's edge hook; one instance per entry model instance and fed stage."""

    def __init__(self, pipeline: PipelineConfig, stage: StageConfig, deploy: DeployConfig):
        self.pipeline = pipeline
        self.stage = stage
        self.deploy = deploy

    def run(self, request: dict[str, Any], sources: dict[int, AsyncIterator[Outputs]],
            stage: StageCall) -> AsyncIterator[Outputs]:
        """The fed stage's outputs for one client request; `sources` by source stage id."""
        raise NotImplementedError


class SourceReader:
    """A source stream read in a task of its own, so it keeps arriving while the transfer waits on
    the fed stage: `on_output` is called with each output; `await reader.more(stage)` returns when
    something arrived or the source ended (`finished`; its error is raised by `check()`)."""

    def __init__(self, source: AsyncIterator[Outputs], on_output) -> None:
        self.finished = False
        self.error: BaseException | None = None
        self._arrived = asyncio.Event()
        self._source = source
        self._on_output = on_output
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            async for out in self._source:
                self._on_output(out)
                self._arrived.set()
        except BaseException as e:  # handed to the consumer by check()
            self.error = e
        finally:
            self.finished = True
            self._arrived.set()

    def check(self) -> None:
        """Raise the source's error, if it ended with one."""
        if isinstance(self.error, Exception):
            raise self.error

    async def more(self, stage: "StageCall", ready) -> None:
        """Wait until `ready()` is true or the source ended (watching for the client leaving)."""
        self._arrived.clear()
        if not ready() and not self.finished:
            await stage.wait(self._arrived.wait())

    async def aclose(self) -> None:
        if not self._task.done():
            self._task.cancel()
            await asyncio.wait({self._task})
