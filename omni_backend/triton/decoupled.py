"""Base class for decoupled Triton Python models, served from our own event loop.

`execute` is a plain method that hands each request to an asyncio loop running on a thread of
ours and returns `None` at once (the design of Triton's own vLLM backend). It is never a
coroutine: the 2.51 stub runs a coroutine `execute` with `run_coroutine_threadsafe` and then
registers the future in a set that a done-callback empties. A coroutine that finishes at once
(a control request, a fast error) runs that callback, from the loop thread, before the future is
added: "Cannot remove future from background; KeyError" (Triton server issue #8537), a finished
future kept forever, and C++ stub code re-entered from a second thread while the main thread is
inside the same stub. Under overload that path ended in SIGSEGV in tritonserver. Here the stub
only ever sees a synchronous `execute`, and every task lives and dies on our loop.

Every request runs inside one guarded coroutine that always ends the stream with FINAL, turns
exceptions into an error response for that client only, checks cancellation before each chunk,
and releases per-request state in `finally`. Responses leave from a thread of their own
(response_thread.py), never from the loop. `finalize` (unload, reload, shutdown) ends every
open stream with an `unavailable:` error rather than leaving its client waiting. But Triton calls
`finalize` only once every stream of the model has ended (a response factory holds the model), so
a stream stuck on a dead stage must be ended first: `abort_all`, which the supervisor asks for
(`CONTROL=abort`) before it unloads or stops anything.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import traceback
from typing import Any, AsyncIterator

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backend.errors import Cancelled, InvalidRequest, PipelineError, Unavailable
from omni_backend.glibc_heaps import freeze_loaded_objects, release_free_memory_in_background
from omni_backend.stubs import stub_process
from omni_backend.triton.response_thread import ResponseThread
from omni_backend.triton.stream_waits import watched
from omni_backend.triton.worker_threads import DaemonThreadPool

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


CANCEL_POLL_S = 0.1   # how often a waiting stream checks whether its client left

class StreamContext:
    """Per-request state of one stream; lives exactly as long as the stream."""

    def __init__(self, request: "pb_utils.InferenceRequest | None", sender: Any = None):
        self.request = request
        # the request's response sender, or what stands in for it (a stream pulled by its caller)
        self.sender = sender if sender is not None else request.get_response_sender()
        self.request_id = (request.request_id() if request is not None else "") or ""
        self._cancelled = False
        self.abort: PipelineError | None = None   # why the model ended this stream itself
        self.final_sent = False
        self.task: asyncio.Task | None = None
        self.resources: list[Any] = []   # things with `async aclose()`, closed on release
        # when Triton was last asked whether the client left. Not at once: the first ask would fall
        # on the first chunk's path (a round trip to tritonserver, ~1 ms of a small model's first
        # audio); a client that leaves right away is seen within CANCEL_POLL_S, as later.
        self._asked_at = time.monotonic()

    def cancelled(self) -> bool:
        """The client went away, or the stream is over. Once the final response is sent, Triton
        may free the request's response factory, and asking it `is_cancelled` then crashes
        tritonserver (SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled, seen when an abort
        ended streams whose work was still running): a finished stream is never asked."""
        if self._cancelled or self.final_sent or self.sender is None:
            return True
        # Each ask is a round trip to tritonserver made on the event loop; a stream awaits several
        # things at once (a pipeline's transfers, its client reader), each polling: one ask per
        # CANCEL_POLL_S per stream is enough.
        now = time.monotonic()
        if now - self._asked_at < CANCEL_POLL_S:
            return False
        self._asked_at = now
        if self.sender.is_cancelled():
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


class DecoupledModel:
    """Subclasses implement `setup()` and `stream(ctx)`; they yield lists of output tensors.

    `error_before_final`: a stream's error goes out as a response of its own (`error_response`),
    then FINAL alone. Models called over BLS need it: in 2.51 the caller's BLS iterator never
    shows a stream's error (`has_error()` is false, the message is gone), so such a model sends its
    errors as data (omni_backend/triton/stage.py).

    A request with a `CONTROL` input is a message to the model, not a stream: `ping` is answered
    from the event loop (the supervisor's liveness probe); subclasses add their own in `control`.
    """

    error_before_final = False

    def initialize(self, args: dict) -> None:
        stub_process.start_orphan_guard()
        stub_process.dump_stacks_on_signal()
        release_free_memory_in_background()   # BLS and response threads: bounded heaps, trimmed
        self.model_config = json.loads(args["model_config"])
        self.model_name = args["model_name"]
        self.parameters = {k: v.get("string_value", "")
                           for k, v in self.model_config.get("parameters", {}).items()}
        self.active: dict[int, StreamContext] = {}
        self.tasks: set[asyncio.Task] = set()
        # BLS and blocking library calls run here, never on the event loop.
        self.executor = DaemonThreadPool(max_workers=int(self.parameters.get("threads_in_flight", "64")),
                                           thread_name_prefix=self.model_name)
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._run_loop, name=f"{self.model_name}-loop", daemon=True)
        self._loop_thread.start()
        self.responses = ResponseThread(self.model_name, pb_utils.Logger.log_warn)
        stub_process.start_heartbeat(self.loop, self.responses.stalled_for)
        self.setup()
        freeze_loaded_objects()   # the periodic full collection skips what start-up loaded

    def run_inside(self, host: "DecoupledModel", model_name: str, parameters: dict[str, str]) -> None:
        """Set up as a part of `host`'s process instead of as a Triton model of its own (a stage
        run in the entry's process, omni_backend/triton/local_stage.py): the host's event loop,
        threads and response thread, then `setup()`. The host calls `release_resources()`."""
        self.model_config = {"parameters": {}, "input": []}
        self.model_name = model_name
        self.parameters = dict(parameters)
        self.active = {}
        self.tasks = set()
        self.executor, self.loop, self.responses = host.executor, host.loop, host.responses
        self.setup()

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def setup(self) -> None:
        pass

    async def stream(self, ctx: StreamContext) -> AsyncIterator[list["pb_utils.Tensor"]]:
        raise NotImplementedError
        yield  # pragma: no cover

    async def control(self, request: "pb_utils.InferenceRequest", command: str) -> None:
        """Handle a CONTROL request; raise a PipelineError to answer with an error."""
        if command != "ping":
            raise InvalidRequest("CONTROL", f"unknown command {command!r}")

    def on_start(self, ctx: StreamContext) -> None:
        pass

    def on_finish(self, ctx: StreamContext, outcome: str, error_code: str | None) -> None:
        pass

    async def run_blocking(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def wait(self, ctx: StreamContext, awaitable, poll_s: float = CANCEL_POLL_S):
        """Await something slow while watching for the client going away."""
        return await watched(awaitable, ctx.cancelled, poll_s)

    def execute(self, requests: list) -> None:
        # Never a coroutine (see the module docstring): hand over and return.
        for request in requests:
            self.loop.call_soon_threadsafe(self._spawn, request)
        return None

    def _spawn(self, request: "pb_utils.InferenceRequest") -> None:
        task = self.loop.create_task(self._dispatch(request))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def command(self, request: "pb_utils.InferenceRequest") -> str | None:
        """The request's CONTROL message, or None for a stream."""
        command = input_bytes(request, "CONTROL") if self._has_control_input() else None
        return None if command is None else command.decode(errors="replace").strip()

    async def _dispatch(self, request: "pb_utils.InferenceRequest") -> None:
        command = self.command(request)
        if command is None:
            await self._serve(request)
            return
        sender = request.get_response_sender()
        error = None
        try:
            await self.control(request, command)
        except PipelineError as e:
            error = str(e)
        except Exception as e:  # noqa: BLE001 - a control message never takes the model down
            error = f"internal: {type(e).__name__}: {e}"
            pb_utils.Logger.log_error(f"{self.model_name}: {traceback.format_exc()}")
        response = None if error is None else pb_utils.InferenceResponse(error=pb_utils.TritonError(error))
        self.responses.send(sender, response, FINAL)

    def _has_control_input(self) -> bool:
        if not hasattr(self, "_control_input"):
            self._control_input = any(i.get("name") == "CONTROL" for i in self.model_config.get("input", []))
        return self._control_input

    async def _serve(self, request: "pb_utils.InferenceRequest", sender: Any = None) -> None:
        ctx = StreamContext(request, sender)
        ctx.task = asyncio.current_task()
        self.active[id(ctx)] = ctx
        outcome, code, error = "ok", None, None
        try:
            self.on_start(ctx)
            async for tensors in self.stream(ctx):
                if ctx.final_sent or ctx.cancelled():
                    raise Cancelled()
                if not tensors:   # nothing to say (a pulled stream's empty response is its end)
                    continue
                sent = self.responses.send(ctx.sender, pb_utils.InferenceResponse(output_tensors=tensors))
                try:
                    await asyncio.wrap_future(sent)
                except Exception:  # noqa: BLE001 - the response did not leave: the client is gone
                    raise Cancelled() from None
        except (Cancelled, asyncio.CancelledError) as e:
            if ctx.abort is None and isinstance(e, asyncio.CancelledError):
                ctx.abort = Unavailable(f"{self.model_name} stopped; retry")
            if ctx.abort is None:
                outcome = "cancelled"        # the client left
            else:                            # the model ended it (unload, restart, drain)
                outcome, code, error = "error", ctx.abort.code, str(ctx.abort)
        except PipelineError as e:
            outcome, code, error = "error", e.code, str(e)
        except Exception as e:  # noqa: BLE001 - one request's crash must not leak to others
            outcome, code, error = "error", "internal", f"internal: {type(e).__name__}: {e}"
            pb_utils.Logger.log_error(f"{self.model_name}: {traceback.format_exc()}")
        finally:
            self._finish(ctx, outcome, code, error)
            try:
                await ctx.release()
            finally:
                # Triton frees a request's response factory only when the Python objects die; an
                # exception traceback can keep this frame (and ctx) in a cycle until the next GC,
                # which would keep the model from unloading. Drop the references now.
                ctx.sender = None
                ctx.request = None

    def error_response(self, message: str) -> "pb_utils.InferenceResponse":
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))

    def _finish(self, ctx: StreamContext, outcome: str, code: str | None, error: str | None) -> None:
        """Send the stream's last response and count it, once. This comes before releasing what
        the stream held: a release can wait on a stage that died, its client must not."""
        if ctx.final_sent:
            return
        ctx.final_sent = True
        response = None if error is None else self.error_response(error)
        if response is not None and self.error_before_final:
            self.responses.send(ctx.sender, response)
            response = None
        self.responses.send(ctx.sender, response, FINAL)   # after the stream's earlier responses
        self.active.pop(id(ctx), None)
        self.on_finish(ctx, outcome, code)

    async def abort_all(self, reason: PipelineError) -> None:
        """End every open stream with `reason` (sent as its final response)."""
        for ctx in list(self.active.values()):
            ctx.abort = ctx.abort or reason
            self._finish(ctx, "error", ctx.abort.code, str(ctx.abort))
            if ctx.task is not None:
                ctx.task.cancel()   # then it releases what it held, in its own time

    def die(self, reason: PipelineError, exit_code: int = 70) -> None:
        """This stage cannot serve any more (a process it depends on died): end every open stream
        with `reason`, let those responses leave, and end the stub, so the supervisor sees a dead
        stage and reloads it. Callable from any thread but the event loop's."""
        try:
            asyncio.run_coroutine_threadsafe(self.abort_all(reason), self.loop).result(5.0)
        except Exception:  # noqa: BLE001 - the process ends whatever a stream does
            pb_utils.Logger.log_warn(f"{self.model_name}: streams still open when the stage died")
        self.responses.close()
        stub_process.exit_after_finalize(exit_code)

    def finalize(self) -> None:
        reason = Unavailable(f"{self.model_name} is being unloaded (restart or shutdown); retry")
        try:
            asyncio.run_coroutine_threadsafe(self.abort_all(reason), self.loop).result(5.0)
        except Exception:  # noqa: BLE001 - unloading goes on whatever a stream does
            pb_utils.Logger.log_warn(f"{self.model_name}: streams still open at unload")
        stub_process.stop_loop_watch()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(2.0)
        self.responses.close()   # the last responses leave before the process ends
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.release_resources()
        stub_process.exit_after_finalize()

    def release_resources(self) -> None:
        """What a subclass must close before the process ends (engines, files)."""
