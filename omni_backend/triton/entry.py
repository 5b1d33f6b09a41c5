"""The pipeline entry model: the one clients call.

It validates TEXT/PARAMS through the model type's adapter, streams stage 0 over BLS and, for
two-stage pipelines, runs the codec chunk schedule (see codec_stream.py). It owns the response
stream, metrics, admission and cancellation.

CONTROL messages (from the supervisor, omni_backend/supervisor): `ping` asks every stage too and
fails naming the first stage that does not answer; `drain` (before a shutdown) turns new streams
away with `unavailable:` while the running ones finish; `abort` ends every open stream with
`unavailable: <TEXT>` (a stage died, or the drain ran out of time).
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, AsyncIterator

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backend.adapters import adapter_class
from omni_backend.deploy import parse_deploy
from omni_backend.errors import Unavailable
from omni_backend.pipeline import get_pipeline
from omni_backend.triton.bls import StageStream, ping_stage
from omni_backend.triton.decoupled import DecoupledModel, StreamContext, bytes_tensor, input_bytes
from omni_backend.triton.metrics import PipelineMetrics
from omni_backend.triton.stage_liveness import StageLiveness

STAGE_PING_TIMEOUT_S = 2.5   # under the supervisor's own 3 s, so the answer names the stage


class PipelineEntry(DecoupledModel):
    def setup(self) -> None:
        self.pipeline = get_pipeline(self.parameters["pipeline"])
        self.deploy = parse_deploy(self.param_json("deploy"), f"{self.model_name}/config.pbtxt")
        self.model_path = self.parameters.get("model") or self.pipeline.default_model
        self.adapter = adapter_class(self.pipeline.model_type).from_model(self.model_path)
        self.sample_rate = self.pipeline.sample_rate
        self.metrics = PipelineMetrics(self.pipeline.name)
        self.metrics.active.set(0)   # a reloaded entry starts from the truth
        self.draining = False
        self.liveness = StageLiveness()
        self.stage0 = self.pipeline.stage_model_name(self.pipeline.stages[0])
        self.codec = None
        if len(self.pipeline.stages) > 1:
            from omni_backend.triton.codec_stream import CodecStreamer
            self.codec = CodecStreamer(self, self.deploy)

    async def control(self, request: "pb_utils.InferenceRequest", command: str) -> None:
        if command == "drain":
            self.draining = True
            return
        if command == "abort":  # TEXT says why; every open stream ends with it
            why = (input_bytes(request, "TEXT") or b"").decode(errors="replace").strip()
            pb_utils.Logger.log_info(f"{self.model_name}: aborting {len(self.active)} streams: {why}")
            await self.abort_all(Unavailable(f"{self.pipeline.name}: {why or 'the pipeline is restarting'}; retry"))
            return
        if command != "ping":
            return await super().control(request, command)
        rid = f"ping-{uuid.uuid4().hex[:12]}"
        checks = []
        for stage in self.pipeline.stages:
            name = self.pipeline.stage_model_name(stage)
            ping = self.run_blocking(ping_stage, name, rid) if stage.decoupled else self.codec.ping(rid)
            checks.append(self.liveness.check(name, ping, STAGE_PING_TIMEOUT_S))
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

    def stage0_stream(self, ctx: StreamContext, request: dict[str, Any], outputs: list[str]) -> StageStream:
        rid = f"{ctx.request_id or 'req'}-{uuid.uuid4().hex[:12]}"
        stream = StageStream(self.executor, self.stage0, rid,
                             [bytes_tensor("REQUEST", json.dumps(request)), bytes_tensor("REQUEST_ID", rid)],
                             outputs, self.liveness)
        ctx.resources.append(stream)
        return stream

    async def audio(self, ctx: StreamContext, request: dict[str, Any]) -> AsyncIterator[np.ndarray]:
        if self.codec is not None:
            async for chunk in self.codec.stream(ctx, request):
                yield chunk
            return
        upstream = self.stage0_stream(ctx, request, ["AUDIO"]).__aiter__()
        while True:
            try:
                out = await self.wait(ctx, upstream.__anext__())
            except StopAsyncIteration:
                return
            yield out["AUDIO"].reshape(-1)

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
