"""The pipeline entry model: the one clients call.

It validates TEXT/PARAMS through the pipeline's adapter and runs the pipeline's stage graph as
declared (omni_backend/pipeline.py): stages fed by the client's request get its JSON as REQUEST;
every other stage is fed by its family's transfer hook (omni_backend/triton/transfer.py) from its
sources' streams; a stream read by several consumers is broadcast. The final stage's AUDIO is
streamed to the client. It owns the response stream, metrics, admission and cancellation.

CONTROL messages (from the supervisor, omni_backend/supervisor): `ping` asks every stage too and
fails naming the first stage that does not answer; `drain` (before a shutdown) turns new streams
away with `unavailable:` while the running ones finish; `abort` ends every open stream with
`unavailable: <TEXT>` (a stage died, or the drain ran out of time). From clients: `append` gives
a running stream that was opened with `streaming_input` more text (omni_backend/triton/text_input.py).
"""
from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, AsyncIterator

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backend.errors import Unavailable
from omni_backend.families import built_model, import_path
from omni_backend.glibc_heaps import bound_malloc_retention
from omni_backend.triton.decoupled import DecoupledModel, StreamContext, input_bytes
from omni_backend.triton.metrics import PipelineMetrics
from omni_backend.triton.stage_liveness import StageLiveness
from omni_backend.triton.text_input import STREAMING_INPUT, TextInputs
from omni_backend.triton.transfer import Broadcast, Outputs, StageCall, ping

STAGE_PING_TIMEOUT_S = 2.5   # under the supervisor's own 3 s, so the answer names the stage


class PipelineEntry(DecoupledModel):
    def setup(self) -> None:
        bound_malloc_retention()   # dozens of BLS threads: each would keep a glibc heap at its peak
        built = built_model(self.parameters, self.model_name)
        self.pipeline, self.deploy, self.model_path = built.pipeline, built.deploy, built.model_path
        self.adapter = import_path(self.pipeline.adapter).from_model(self.model_path)
        self.sample_rate = self.pipeline.sample_rate
        self.metrics = PipelineMetrics(self.pipeline.name)
        self.metrics.active.set(0)   # a reloaded entry starts from the truth
        self.draining = False
        self.liveness = StageLiveness()
        self.transfers = {s.stage_id: import_path(s.transfer)(self.pipeline, s, self.deploy)
                          for s in self.pipeline.stages if s.transfer}
        self.text_inputs = TextInputs(self)

    async def control(self, request: "pb_utils.InferenceRequest", command: str) -> None:
        if command == "drain":
            self.draining = True
            return
        if command == "append":
            await self.text_inputs.append(input_bytes(request, "TEXT"), input_bytes(request, "PARAMS"))
            return
        if command == "abort":  # TEXT says why; every open stream ends with it
            why = (input_bytes(request, "TEXT") or b"").decode(errors="replace").strip()
            pb_utils.Logger.log_info(f"{self.model_name}: aborting {len(self.active)} streams: {why}")
            await self.abort_all(Unavailable(f"{self.pipeline.name}: {why or 'the pipeline is restarting'}; retry"))
            return
        if command != "ping":
            return await super().control(request, command)
        rid = f"ping-{uuid.uuid4().hex[:12]}"
        checks = [self.liveness.check(self.pipeline.stage_model_name(stage), ping(self, stage, rid),
                                      STAGE_PING_TIMEOUT_S) for stage in self.pipeline.stages]
        for result in await asyncio.gather(*checks, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result

    def on_start(self, ctx: StreamContext) -> None:
        ctx.t0 = time.perf_counter()
        if self.draining:
            raise Unavailable(f"{self.pipeline.name}: the server is shutting down; retry on another server")
        if len(self.active) > self.deploy.entry.max_streams:
            raise Unavailable(f"{self.pipeline.name} is at its limit of "
                              f"{self.deploy.entry.max_streams} concurrent streams; retry shortly", busy=True)
        self.metrics.active.set(len(self.active))

    def on_finish(self, ctx: StreamContext, outcome: str, error_code: str | None) -> None:
        self.metrics.active.set(len(self.active))
        self.metrics.finished(outcome, error_code)

    def graph(self, ctx: StreamContext, request: dict[str, Any]) -> tuple[AsyncIterator[Outputs], list]:
        """Every stage's stream for one request, wired as declared; returns the final stage's
        stream and what to close when the request ends (the transfers' generators, broadcasts)."""
        streams: dict[int, Any] = {}
        closers: list = []
        ctx.request_streams = []   # the streams fed the client's request: they take appended text
        for stage in self.pipeline.stages:
            call = StageCall(self, ctx, stage)
            if stage.takes_request:
                stream = call.stream(request=request)
                ctx.request_streams.append(stream)
            else:
                sources = {i: streams[i].tap() if isinstance(streams[i], Broadcast) else streams[i]
                           for i in stage.input_sources}
                stream = self.transfers[stage.stage_id].run(request, sources, call)
                closers.append(stream)
            readers = len(self.pipeline.consumers(stage.stage_id)) + stage.final_output
            if readers > 1:
                stream = Broadcast(stream, readers)
                closers.append(stream)
            streams[stage.stage_id] = stream
        final = streams[self.pipeline.final_stage.stage_id]
        return (final.tap() if isinstance(final, Broadcast) else final), closers

    async def audio(self, ctx: StreamContext, request: dict[str, Any]) -> AsyncIterator[np.ndarray]:
        final, closers = self.graph(ctx, request)
        text = None
        iterator = final.__aiter__()
        pending: asyncio.Future | None = None
        try:
            if request.get(STREAMING_INPUT):   # registered before the first await: appends may follow at once
                text = self.text_inputs.register(ctx.request_id, ctx.request_streams)
            while True:
                pending = asyncio.ensure_future(iterator.__anext__())
                try:
                    out = await self.wait(ctx, pending)
                except StopAsyncIteration:
                    return
                pending = None
                if "AUDIO" in out:
                    yield out["AUDIO"].reshape(-1)
        finally:
            # A step still running (the client left, or an abort) is stopped first: a generator
            # cannot be closed while it runs, and its work must not outlive the stream.
            if pending is not None and not pending.done():
                pending.cancel()
                await asyncio.wait({pending})
            if text is not None:
                await self.text_inputs.unregister(ctx.request_id, text)
            for closer in reversed(closers):   # the stage streams themselves close with ctx
                await closer.aclose()

    async def stream(self, ctx: StreamContext) -> AsyncIterator[list["pb_utils.Tensor"]]:
        request = self.adapter.validate(input_bytes(ctx.request, "TEXT") or b"",
                                        input_bytes(ctx.request, "PARAMS"))
        rate = np.array([self.sample_rate], dtype=np.int32)
        first = True
        async for audio in self.audio(ctx, request):
            if audio.size == 0:
                continue
            if first:
                self.metrics.ttfa_ms.observe((time.perf_counter() - ctx.t0) * 1000.0)
                first = False
            self.metrics.audio_seconds.increment(audio.size / self.sample_rate)
            yield [pb_utils.Tensor("AUDIO", np.ascontiguousarray(audio, dtype=np.float32)),
                   pb_utils.Tensor("SAMPLE_RATE", rate)]
