"""A stream stage run inside the entry model's process (deploy: `stages[i].process: entry`).

Every Triton process hop on a chunk's path is a round trip through tritonserver and a Python
stub (a request in, each response out, each BLS pull): on a small model the first chunk's path
client -> entry -> stage -> entry -> client spends as long in them as in the compute. A stage
deployed with `process: entry` has no Triton model: the entry builds it as Triton would (its
class, its parameters; `DecoupledModel.run_inside`) and reads its streams on its own event
loop, so the stage's code is the same either way and its output is too.

What it costs: the stage no longer lives apart from the entry (a crash of its process is the
entry's, and the supervisor reloads the pipeline as a whole), and the pipeline has one entry
instance (each would load the stage's engine); the deploy checks both.
"""
from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any, AsyncIterator

import numpy as np

from omni_backend.errors import Cancelled
from omni_backend.families import import_path
from omni_backend.pipeline import PipelineConfig, StageConfig
from omni_backend.triton.decoupled import StreamContext

if TYPE_CHECKING:
    from omni_backend.triton.decoupled import DecoupledModel
    from omni_backend.triton.stage import StageModel

Outputs = dict[str, np.ndarray]
_END = object()


class LocalStage:
    """One stream stage loaded in the entry's process."""

    def __init__(self, host: "DecoupledModel", pipeline: PipelineConfig, stage: StageConfig):
        cls = import_path(stage.triton_class)
        self.model: "StageModel" = cls()
        self.model.run_inside(host, pipeline.stage_model_name(stage), {**host.parameters, "stage_id": str(stage.stage_id)})

    def stream(self, caller: StreamContext, request_id: str, request: dict[str, Any] | None,
               inputs: Outputs) -> "LocalStageStream":
        return LocalStageStream(self.model, caller, request_id, request, inputs)

    def close(self) -> None:
        self.model.release_resources()


class _Caller:
    """Stands in for a stream's response sender: the stage's stream is cancelled when the
    entry's client left (as a BLS stream's stage learns it from the entry's cancel)."""

    def __init__(self, caller: StreamContext):
        self.caller = caller

    def is_cancelled(self) -> bool:
        return self.caller.cancelled()


class LocalStageStream:
    """One stream of a local stage, read like a BLS stream (omni_backend/triton/bls.StageStream):
    an async iterator of {output name: array}, `opened`, `append_text`, `append_inputs` and
    `aclose`. The stage runs in a task of its own that queues its outputs, so it goes on while
    the entry awaits something else, and its end (release of what it held) never depends on a
    reader."""

    def __init__(self, model: "StageModel", caller: StreamContext, request_id: str,
                 request: dict[str, Any] | None, inputs: Outputs):
        self.model = model
        self.model_name = model.model_name
        self.request_id = request_id
        # the stage reads the request as it would from JSON: a copy of its own, the same types
        self._request = None if request is None else json.loads(json.dumps(request))
        self._inputs = inputs
        self._ctx = StreamContext(None, _Caller(caller))   # no Triton request: it was read already
        self._ctx.request_id = request_id
        self._queue: asyncio.Queue = asyncio.Queue()
        self._task: asyncio.Task | None = None
        self._closed = False

    def _start(self) -> None:
        if self._task is None and not self._closed:
            self._task = asyncio.ensure_future(self._run())

    async def __aiter__(self) -> AsyncIterator[Outputs]:
        self._start()
        while True:
            item = await self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    async def _run(self) -> None:
        ctx, model = self._ctx, self.model
        ctx.task = asyncio.current_task()
        model.active[id(ctx)] = ctx
        try:
            async for tensors in model.open_stream(ctx, self.request_id, self._request, self._inputs):
                if ctx.cancelled():
                    raise Cancelled()
                if tensors:
                    self._queue.put_nowait({t.name(): t.as_numpy() for t in tensors})
            self._queue.put_nowait(_END)
        except (Cancelled, asyncio.CancelledError):
            # the caller's client left (its reader learns it from this, and counts it so) or the
            # caller closed this stream (nobody reads on)
            self._queue.put_nowait(Cancelled())
        except Exception as e:  # noqa: BLE001 - the stage's error is its caller's, as over BLS
            self._queue.put_nowait(e)
        finally:
            ctx.final_sent = True
            model.active.pop(id(ctx), None)
            try:
                await ctx.release()
            finally:
                ctx.sender = None

    async def opened(self) -> None:
        """The stream runs (text appended from now on waits in the stage for it, if need be)."""
        self._start()

    async def append_text(self, text: str, end: bool) -> None:
        await self.opened()
        await self.model.append(self.request_id, text, {}, end)

    async def append_inputs(self, inputs: list, end: bool) -> None:
        """More input tensors (pb_utils.Tensor, as a BLS stream takes them) for the stage's stream."""
        await self.opened()
        await self.model.append(self.request_id, "", {t.name(): t.as_numpy() for t in inputs}, end)

    async def aclose(self) -> None:
        """Stop the stage's stream if it still runs, and wait until it released what it held."""
        self._closed = True
        task = self._task
        if task is None or task.done():
            return
        self._ctx.cancel()
        self.model.on_cancel(self._ctx)   # an engine frees the slot now, not at its next event
        task.cancel()
        await asyncio.wait({task})
