"""Edges of the stage graph: how one stage's stream becomes the next stage's requests.

A fed stage (one with `input_sources`, omni_backend/pipeline.py) names a `Transfer` class owned by
its model family. For each client request the entry model calls `Transfer.run` with the client's
normalized request, the source stages' output streams and a `StageCall` for the fed stage; what
`run` yields is the fed stage's output stream. A transfer may open one stream on a stream stage
and hand it the source's output chunk by chunk while it runs (`StageCall.append`: tokens or
hidden states), or make many calls to a batched stage (codec windows); it
awaits through `StageCall.wait` so a client that leaves stops it at once.
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
from omni_backend.triton.bls import StageStream, append_stage_inputs, call_stage, ping_stage
from omni_backend.triton.decoupled import StreamContext, bytes_tensor

if TYPE_CHECKING:
    from omni_backend.triton.entry import PipelineEntry

Outputs = dict[str, np.ndarray]


def _tensor(spec: TensorSpec, value: Any) -> "pb_utils.Tensor":
    if spec.dtype == "STRING" and isinstance(value, (str, bytes)):
        return bytes_tensor(spec.name, value)
    return pb_utils.Tensor(spec.name, np.ascontiguousarray(value, dtype=spec.numpy_dtype))


class StageCall:
    """One client request's access to one stage: streams (stream stages), calls (batched
    stages), each named `<request id>-<n>` so its traces line up."""

    def __init__(self, entry: "PipelineEntry", ctx: StreamContext, stage: StageConfig):
        self.entry = entry
        self.ctx = ctx
        self.stage = stage
        self.model_name = entry.pipeline.stage_model_name(stage)
        self.request_id = f"{ctx.request_id or 'req'}-{uuid.uuid4().hex[:12]}"
        self._specs = {t.name: t for t in stage.inputs}
        self._calls = 0

    def _inputs(self, tensors: dict[str, Any]) -> list["pb_utils.Tensor"]:
        unknown = set(tensors) - set(self._specs)
        if unknown:
            raise ValueError(f"{self.model_name} declares no inputs {sorted(unknown)}")
        return [_tensor(self._specs[name], value) for name, value in tensors.items()]

    def stream(self, tensors: dict[str, Any] | None = None, request: dict[str, Any] | None = None) -> StageStream:
        """Open a stream on a stream stage; closed with the client's request at the latest."""
        inputs = self._inputs(tensors or {})
        if request is not None:
            inputs.append(bytes_tensor("REQUEST", json.dumps(request)))
        rid = self.request_id if self._calls == 0 else f"{self.request_id}-{self._calls}"
        self._calls += 1
        stream = StageStream(self.entry.executor, self.model_name, rid, [*inputs, bytes_tensor("REQUEST_ID", rid)],
                             [t.name for t in self.stage.outputs], self.entry.liveness)
        self.ctx.resources.append(stream)
        return stream

    async def append(self, stream: StageStream, tensors: dict[str, Any], end: bool = False) -> None:
        """More input tensors for a stream this call opened (the source's next chunk; `end`: the
        source ended). Await each append before the next: they arrive in order."""
        inputs = self._inputs(tensors)
        await self.wait(stream.opened())
        await self.wait(self.entry.run_blocking(append_stage_inputs, self.model_name, stream.request_id, inputs, end))

    async def call(self, tensors: dict[str, Any]) -> Outputs:
        """One request to a batched stage, one answer."""
        rid = f"{self.request_id}-w{self._calls}"
        self._calls += 1
        out = await self.wait(self.entry.run_blocking(
            call_stage, self.model_name, self._inputs(tensors), [t.name for t in self.stage.outputs], rid))
        self.entry.liveness.answered(self.model_name)
        return out

    async def wait(self, awaitable):
        """Await while watching for the client going away (then Cancelled is raised)."""
        return await self.entry.wait(self.ctx, awaitable)


async def ping(entry: "PipelineEntry", stage: StageConfig, request_id: str) -> None:
    """Whether a stage answers: CONTROL=ping to a stream stage, empty inputs to a batched one."""
    name = entry.pipeline.stage_model_name(stage)
    if stage.kind == "stream":
        await entry.run_blocking(ping_stage, name, request_id)
        return
    inputs = [_tensor(spec, spec.empty(batched=True)) for spec in stage.inputs]
    await entry.run_blocking(call_stage, name, inputs, [t.name for t in stage.outputs], request_id)


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


class Broadcast:
    """One stage's stream read by several consumers (stages it feeds, or the client too): each
    tap sees every item; the source is read as fast as the fastest tap wants."""

    def __init__(self, source: AsyncIterator[Outputs], taps: int):
        self.source = source
        self.queues: list[asyncio.Queue] = [asyncio.Queue() for _ in range(taps)]
        self.task: asyncio.Task | None = None
        self.handed = 0

    async def _pump(self) -> None:
        try:
            async for item in self.source:
                for q in self.queues:
                    q.put_nowait(("item", item))
            for q in self.queues:
                q.put_nowait(("end", None))
        except BaseException as e:   # every tap raises it
            for q in self.queues:
                q.put_nowait(("error", e))
            if isinstance(e, asyncio.CancelledError):
                raise

    def tap(self) -> AsyncIterator[Outputs]:
        queue = self.queues[self.handed]
        self.handed += 1
        return self._read(queue)

    async def _read(self, queue: asyncio.Queue) -> AsyncIterator[Outputs]:
        if self.task is None:
            self.task = asyncio.ensure_future(self._pump())
        while True:
            kind, value = await queue.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value

    async def aclose(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.wait({self.task})
