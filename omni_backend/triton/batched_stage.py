"""Base class for batched stages: stateless, one response per request, Triton dynamic batching.

Requests carry the stage's declared inputs (omni_backend/pipeline.py) with a leading batch
dimension. A request whose variable-size inputs are all empty is the entry's liveness ping and is
answered with empty outputs. The rest are grouped by `batch_key` (requests that can run as one
batch) and each group runs through `run_batch`; a failing group fails its own requests only.
Families implement `load`, `batch_key` and `run_batch`.

`execute` only queues the requests and returns None; a worker thread runs the batches and answers
each request through its response sender (one response, FINAL: allowed for a non-decoupled model).
Why: while tritonserver waits for `execute` to return, the 2.51 Python backend checks every second
that the stub's health thread has run, and a stub the host did not schedule for that second (an
overloaded CPU, a paused process) is declared "not healthy": that call fails, and the server's and
the stub's message queues are left one message apart, so the next call reads a message the other
side has freed and tritonserver aborts (`boost::interprocess::lock_exception` or SIGSEGV in
`IPCMessage::LoadFromSharedMemory`; perf/investigations/stub_health_desync.py shows it in seconds). A model
that computes in `execute` is exposed for its whole compute time, one that returns at once only
for that moment. The answer still reaches the caller as a plain (non-decoupled) response: as a
decoupled model answering through its sender, its fast answers crashed the calling entry's stub
within seconds of a storm of streams (perf/RESULTS.md, 2026-12-03).
"""
from __future__ import annotations

import json
import queue
import threading
from typing import Any, Hashable

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backend.errors import PipelineError
from omni_backend.families import built_model
from omni_backend.glibc_heaps import freeze_loaded_objects, release_free_memory_in_background
from omni_backend.stubs import stub_process
from omni_backend.triton.metrics import metric

Inputs = dict[str, np.ndarray]


class BatchedStage:
    def initialize(self, args: dict) -> None:
        stub_process.start_orphan_guard()
        stub_process.dump_stacks_on_signal()
        self.work = stub_process.WorkWatch()   # the heartbeat stops while the worker sleeps mid-batch
        stub_process.start_heartbeat(work=self.work)
        release_free_memory_in_background()   # batches of varying shapes: bounded heaps, trimmed
        config = json.loads(args["model_config"])
        self.model_name = args["model_name"]
        self.parameters = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        built = built_model(self.parameters, self.model_name)
        self.pipeline, self.deploy, self.model_path = built.pipeline, built.deploy, built.model_path
        self.stage_config = self.pipeline.stages[int(self.parameters["stage_id"])]
        self.stage_deploy = self.deploy.stage(self.stage_config.stage_id)
        self.max_batch = max(1, int(config.get("max_batch_size", 0) or 1))
        self.computed = metric("omni_stage_batched_requests_total", labels={"model": self.model_name})
        self.load()
        self._pending: queue.SimpleQueue = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._serve, name=f"{self.model_name}-batches", daemon=True)
        self._worker.start()
        freeze_loaded_objects()   # the periodic full collection skips what start-up loaded

    def load(self) -> None:
        """Load weights; override."""

    def batch_key(self, inputs: Inputs) -> Hashable:
        """Requests with equal keys run as one batch; raise PipelineError to reject a request."""
        return tuple((name, a.shape[1:]) for name, a in inputs.items())

    def run_batch(self, batch: list[Inputs]) -> list[dict[str, np.ndarray]]:
        """One output dict per request (each with its leading batch dimension)."""
        raise NotImplementedError

    def _empty(self) -> dict[str, np.ndarray]:
        return {t.name: t.empty(batched=True) for t in self.stage_config.outputs}

    def _is_ping(self, inputs: Inputs) -> bool:
        variable = [inputs[t.name] for t in self.stage_config.inputs if -1 in t.dims and t.name in inputs]
        return bool(variable) and all(a.size == 0 for a in variable)

    def execute(self, requests: list) -> None:
        """Queue the requests for the worker and return at once (the module's docstring says why)."""
        for request in requests:
            self._pending.put(request)
        return None

    def _serve(self) -> None:
        """The worker: everything queued so far (up to the model's max_batch_size) is one round."""
        work = self.work
        while True:
            work.enter(work.WAITING)
            first = self._pending.get()
            if first is None:
                work.enter(work.DONE)
                return
            work.enter(work.WORKING)
            requests = [first]
            while len(requests) < self.max_batch:
                try:
                    nxt = self._pending.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._pending.put(None)
                    break
                requests.append(nxt)
            try:
                responses = self.answer(requests)
            except Exception as e:  # noqa: BLE001 - the worker must live on: these requests fail
                responses = [self._error_response(e) for _ in requests]
            work.enter(work.SENDING)   # a send may wait on tritonserver
            for request, response in zip(requests, responses):
                try:
                    request.get_response_sender().send(
                        response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                except Exception as e:  # noqa: BLE001 - a caller gone or a server stopping: the rest still go
                    pb_utils.Logger.log_warn(f"{self.model_name}: a response could not be sent: {e}")

    def answer(self, requests: list) -> list:
        """One response per request: pings answered empty, the rest run in groups by batch_key."""
        groups: dict[Hashable, list[int]] = {}
        batches: list[Inputs | None] = []
        responses: list[Any] = [None] * len(requests)
        for i, request in enumerate(requests):
            inputs = {}
            for spec in self.stage_config.inputs:
                t = pb_utils.get_input_tensor_by_name(request, spec.name)
                if t is not None:
                    inputs[spec.name] = t.as_numpy()
            batches.append(inputs)
            if self._is_ping(inputs):
                responses[i] = pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(n, a) for n, a in self._empty().items()])
                continue
            try:
                groups.setdefault(self.batch_key(inputs), []).append(i)
            except PipelineError as e:
                responses[i] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e)))
        for members in groups.values():
            try:
                self.work.run_started(len(members))   # the budget of a batch that never ends
                try:
                    outputs = self.run_batch([batches[i] for i in members])
                finally:
                    self.work.run_ended()
                for i, out in zip(members, outputs):
                    responses[i] = pb_utils.InferenceResponse(
                        output_tensors=[pb_utils.Tensor(n, np.ascontiguousarray(a)) for n, a in out.items()])
                self.computed.increment(len(members))
            except Exception as e:  # noqa: BLE001 - a bad window fails its own requests only
                for i in members:
                    responses[i] = self._error_response(e)
        return responses

    def _error_response(self, e: Exception):
        message = str(e) if isinstance(e, PipelineError) else \
            f"internal: {self.stage_config.model_stage}: {type(e).__name__}: {e}"
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))

    def finalize(self) -> None:
        self._pending.put(None)
        self._worker.join(timeout=5.0)
        stub_process.exit_after_finalize()
