"""Base class for decoupled, async Triton Python models.

The Python backend only logs an exception raised inside `async def execute`: the client gets
neither an error nor FINAL and hangs. Every request here therefore runs inside one guarded
coroutine that always ends the stream with FINAL, turns exceptions into an error response for
that client only, checks cancellation before each chunk, and releases per-request state in
`finally`.
"""
from __future__ import annotations

import asyncio
import json
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any, AsyncIterator

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backend.errors import Cancelled, PipelineError

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class StreamContext:
    """Per-request state of one stream; lives exactly as long as the stream."""

    def __init__(self, request: "pb_utils.InferenceRequest"):
        self.request = request
        self.sender = request.get_response_sender()
        self.request_id = request.request_id() or ""
        self._cancelled = False
        self.resources: list[Any] = []   # things with `async aclose()`, closed on release

    def cancelled(self) -> bool:
        if not self._cancelled and self.sender.is_cancelled():
            self._cancelled = True
        return self._cancelled

    def cancel(self) -> None:
        self._cancelled = True

    async def release(self) -> None:
        while self.resources:
            try:
                await self.resources.pop().aclose()
            except Exception:  # a failing close must not keep the rest alive
                pb_utils.Logger.log_error(f"release failed: {traceback.format_exc()}")


def input_bytes(request: "pb_utils.InferenceRequest", name: str) -> bytes | None:
    """The first element of a BYTES input, or None when the optional input is absent."""
    t = pb_utils.get_input_tensor_by_name(request, name)
    if t is None:
        return None
    arr = t.as_numpy().reshape(-1)
    if arr.size == 0:
        return b""
    v = arr[0]
    return v if isinstance(v, bytes) else str(v).encode()


def bytes_tensor(name: str, value: str | bytes) -> "pb_utils.Tensor":
    if isinstance(value, str):
        value = value.encode()
    return pb_utils.Tensor(name, np.array([value], dtype=np.object_))


def _drop_result(fut: "asyncio.Future") -> None:
    if not fut.cancelled():
        fut.exception()  # mark retrieved: it is abandoned on purpose


class DecoupledModel:
    """Subclasses implement `setup()` and `stream(ctx)`; they yield lists of output tensors."""

    def initialize(self, args: dict) -> None:
        self.model_config = json.loads(args["model_config"])
        self.model_name = args["model_name"]
        self.parameters = {k: v.get("string_value", "")
                           for k, v in self.model_config.get("parameters", {}).items()}
        self.active: dict[int, StreamContext] = {}
        # BLS and blocking library calls run here, never on the event loop.
        self.executor = ThreadPoolExecutor(max_workers=int(self.parameters.get("threads_in_flight", "64")),
                                           thread_name_prefix=self.model_name)
        self.setup()

    def param_json(self, key: str) -> Any:
        return json.loads(self.parameters.get(key) or "null")

    def setup(self) -> None:
        pass

    async def stream(self, ctx: StreamContext) -> AsyncIterator[list["pb_utils.Tensor"]]:
        raise NotImplementedError
        yield  # pragma: no cover

    def on_start(self, ctx: StreamContext) -> None:
        pass

    def on_finish(self, ctx: StreamContext, outcome: str, error_code: str | None) -> None:
        pass

    async def run_blocking(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def wait(self, ctx: StreamContext, awaitable, poll_s: float = 0.1):
        """Await something slow while watching for the client going away."""
        fut = asyncio.ensure_future(awaitable)
        while True:
            done, _ = await asyncio.wait({fut}, timeout=poll_s)
            if done:
                return fut.result()
            if ctx.cancelled():
                fut.add_done_callback(_drop_result)
                raise Cancelled()

    async def execute(self, requests: list) -> None:
        await asyncio.gather(*(self._serve(r) for r in requests))
        requests.clear()
        return None

    async def _serve(self, request: "pb_utils.InferenceRequest") -> None:
        ctx = StreamContext(request)
        self.active[id(ctx)] = ctx
        outcome, code, error = "ok", None, None
        try:
            self.on_start(ctx)
            async for tensors in self.stream(ctx):
                if ctx.cancelled():
                    raise Cancelled()
                ctx.sender.send(pb_utils.InferenceResponse(output_tensors=tensors))
        except Cancelled:
            outcome = "cancelled"
        except PipelineError as e:
            outcome, code, error = "error", e.code, str(e)
        except Exception as e:  # noqa: BLE001 - one request's crash must not leak to others
            outcome, code, error = "error", "internal", f"internal: {type(e).__name__}: {e}"
            pb_utils.Logger.log_error(f"{self.model_name}: {traceback.format_exc()}")
        finally:
            try:
                if error is not None:
                    ctx.sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(error)),
                                    flags=FINAL)
                else:
                    ctx.sender.send(flags=FINAL)
            except Exception:  # the client may be gone; nothing else to do
                pb_utils.Logger.log_warn(f"{self.model_name}: could not send FINAL")
            await ctx.release()
            self.active.pop(id(ctx), None)
            self.on_finish(ctx, outcome, code)
            # Triton frees a request's response factory only when the Python objects die; an
            # exception traceback can keep this frame (and ctx) in a cycle until the next GC,
            # which would keep the model from unloading. Drop the references now.
            ctx.sender = None
            ctx.request = None

    def finalize(self) -> None:
        for ctx in list(self.active.values()):
            ctx.cancel()
        self.executor.shutdown(wait=False, cancel_futures=True)
