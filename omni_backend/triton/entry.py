"""The pipeline entry model: the one clients call.

It validates TEXT/PARAMS through the pipeline's adapter and runs the pipeline's stage graph as
declared (omni_backend/pipeline.py): stages fed by the client's request get its JSON as REQUEST;
every other stage is fed by its family's transfer hook (omni_backend/triton/transfer.py) from its
sources' streams; a stream read by several consumers is broadcast. The final stage's AUDIO and
every stage's declared client outputs (text deltas) are streamed to the client in arrival order,
each response carrying what arrived; a request runs only the stages its adapter does not skip
(`skipped_stages`), so a text-only answer ends with its text streams. It owns the response
stream, metrics, admission and cancellation.

CONTROL messages (from the supervisor, omni_backend/supervisor): `ping` asks every stage too and
fails naming the first stage that does not answer; `drain` (before a shutdown) turns new streams
away with `unavailable:` while the running ones finish; `abort` ends every open stream with
`unavailable: <TEXT>` (the drain ran out of time); `hold` does the same and turns new streams away
with it (a stage died and the supervisor reloads the stages: the entry stays loaded meanwhile, so
no client is told that the pipeline does not exist); after `resume` (the stages are unloaded) it
still does until every stage is loaded again. From clients: `append` gives
a running stream that was opened with `streaming_input` more text (omni_backend/triton/text_input.py);
`cancel` (PARAMS `{"request_id": ...}`) ends a stream whose client left (`cancel_stream`).
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, AsyncIterator

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backend.errors import InvalidRequest, Unavailable
from omni_backend.families import built_model, import_path
from omni_backend.pipeline import StageConfig, TensorSpec
from omni_backend.playback import Playback
from omni_backend.triton.bls import call_stage, ping_stage
from omni_backend.triton.decoupled import DecoupledModel, StreamContext, input_bytes
from omni_backend.triton.local_stage import LocalStage
from omni_backend.triton.metrics import LoopGauge, PipelineMetrics
from omni_backend.triton.stage_liveness import StageLiveness
from omni_backend.triton.stream_broadcast import Broadcast
from omni_backend.triton.stream_waits import in_arrival_order
from omni_backend.triton.text_input import STREAMING_INPUT, TextInputs
from omni_backend.triton.transfer import Outputs, StageCall, stage_tensor

STAGE_PING_TIMEOUT_S = 2.5   # under the supervisor's own 3 s, so the answer names the stage


def cancel_target(params: bytes | None) -> str:
    """A client's cancel request's PARAMS `{"request_id": ...}` -> the stream's request id."""
    try:
        fields = json.loads(params or b"{}")
    except (ValueError, RecursionError):
        fields = None
    if not isinstance(fields, dict) or set(fields) != {"request_id"} \
            or not isinstance(fields["request_id"], str) or not fields["request_id"]:
        raise InvalidRequest("params", 'a cancel\'s PARAMS must be {"request_id": "<the stream\'s request id>"}')
    return fields["request_id"]


# PARAMS larger than this are validated off the event loop (a small request's checks take
# microseconds; a large one may decode recordings or images)
INLINE_VALIDATION_BYTES = 64 * 1024


class PipelineEntry(DecoupledModel):
    """Implements StageHost (omni_backend/triton/stage_host.py) for its transfers and text inputs."""

    def setup(self) -> None:
        built = built_model(self.parameters, self.model_name)
        self.pipeline, self.deploy, self.model_path = built.pipeline, built.deploy, built.model_path
        self.adapter = import_path(self.pipeline.adapter).from_model(self.model_path, self.deploy)
        self.sample_rate = self.pipeline.sample_rate
        self.metrics = PipelineMetrics(self.pipeline.name)
        self.streams_gauge = LoopGauge(self.metrics.active, lambda: len(self.active), self.loop)
        self.draining = False
        self.held: str | None = None       # why new streams are turned away while the stages reload
        self.resuming: str | None = None   # ... after `resume`, until every stage is loaded again
        self.liveness = StageLiveness()
        # the stages the checkpoint runs (the builder wrote no model for the others)
        self.unserved = frozenset(self.adapter.unserved_stages())
        self.served = [s for s in self.pipeline.stages if s.stage_id not in self.unserved]
        self.transfers = {s.stage_id: import_path(s.transfer)(self.pipeline, s, self.deploy)
                          for s in self.served if s.transfer}
        # stages deployed with `process: entry` run here (local_stage.py); the rest over BLS
        self.local_stages = {s.stage_id: LocalStage(self, self.pipeline, s) for s in self.served
                             if self.deploy.stage(s.stage_id).process == "entry"}
        self.text_inputs = TextInputs()
        self.client_specs = {t.name: t for t in self.pipeline.client_output_specs()}

    async def control(self, request: "pb_utils.InferenceRequest", command: str) -> None:
        if command == "drain":
            self.draining = True
            return
        if command == "append":
            await self.text_inputs.append(input_bytes(request, "TEXT"), input_bytes(request, "PARAMS"))
            return
        if command == "cancel":  # the client left: see `cancel_stream`
            self.cancel_stream(cancel_target(input_bytes(request, "PARAMS")))
            return
        if command in ("abort", "hold"):  # TEXT says why; every open stream ends with it
            why = (input_bytes(request, "TEXT") or b"").decode(errors="replace").strip()
            reason = f"{self.pipeline.name}: {why or 'the pipeline is restarting'}; retry"
            if command == "hold":   # before the streams end: none may start in between
                self.held = reason
            pb_utils.Logger.log_info(f"{self.model_name}: {command}: ending {len(self.active)} streams: {why}")
            await self.abort_all(Unavailable(reason))
            return
        if command == "resume":   # the stages are unloaded: serve once they are loaded again
            self.resuming, self.held = self.held, None
            return
        if command != "ping":
            return await super().control(request, command)
        rid = f"ping-{uuid.uuid4().hex[:12]}"
        checks = [self.liveness.check(self.pipeline.stage_model_name(stage), self.ping_stage(stage, rid),
                                      STAGE_PING_TIMEOUT_S) for stage in self.served]
        for result in await asyncio.gather(*checks, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result

    async def ping_stage(self, stage: StageConfig, request_id: str) -> None:
        """Whether a stage answers: CONTROL=ping to a stream stage, empty inputs to a batched one."""
        name = self.pipeline.stage_model_name(stage)
        if stage.stage_id in self.local_stages:   # it runs on this loop, which answers
            return
        if stage.kind == "stream":
            await self.run_blocking(ping_stage, name, request_id)
            return
        inputs = [stage_tensor(spec, spec.empty(batched=True)) for spec in stage.inputs]
        await self.run_blocking(call_stage, name, inputs, [t.name for t in stage.outputs], request_id)

    def cancel_stream(self, request_id: str) -> None:
        """End the one open stream with this request id as its client's leaving would, by message:
        its final response goes now, so its gRPC stream ends without a cancel (a cancelled stream
        leaves a few KB in tritonserver 2.51 for good). Refused unless exactly one stream has the
        id (ids come from clients): the client then cancels its stream instead."""
        matches = [ctx for ctx in self.active.values() if ctx.request_id == request_id]
        if len(matches) != 1:
            raise InvalidRequest("request_id", f"{self.model_name} has {len(matches)} open streams "
                                 f"with request id {request_id!r}; one is needed")
        ctx = matches[0]
        self._finish(ctx, "cancelled", None, None)
        if ctx.task is not None:
            ctx.task.cancel()   # then it releases what it held (its stages' streams), in its own time

    def on_start(self, ctx: StreamContext) -> None:
        ctx.t0 = time.perf_counter()
        if self.draining:
            raise Unavailable(f"{self.pipeline.name}: the server is shutting down; retry on another server")
        if self.held is not None:
            raise Unavailable(self.held)
        if len(self.active) > self.deploy.entry.max_streams:
            raise Unavailable(f"{self.pipeline.name} is at its limit of "
                              f"{self.deploy.entry.max_streams} concurrent streams; retry shortly", busy=True)
        self.streams_gauge.changed()

    def on_finish(self, ctx: StreamContext, outcome: str, error_code: str | None) -> None:
        self.streams_gauge.changed()
        self.metrics.finished(outcome, error_code)

    def graph(self, ctx: StreamContext, request: dict[str, Any],
              run: frozenset[int]) -> tuple[list[tuple[StageConfig, AsyncIterator[Outputs]]], list]:
        """The streams of the stages in `run` for one request, wired as declared; returns the
        streams the client reads (the final stage's, those with client outputs), each with its
        stage, and what to close when the request ends (the transfers' generators, broadcasts)."""
        streams: dict[int, Any] = {}
        closers: list = []
        ctx.request_streams = []   # the streams fed the client's request: they take appended text
        for stage in self.pipeline.stages:
            if stage.stage_id not in run:
                continue
            call = StageCall(self, ctx, stage, self.pipeline.stage_model_name(stage))
            if stage.takes_request:
                stream = call.stream(request=request)
                ctx.request_streams.append(stream)
            else:   # every source runs: a skipped stage's consumers are skipped too
                sources = {i: streams[i].tap() if isinstance(streams[i], Broadcast) else streams[i]
                           for i in stage.input_sources}
                stream = self.transfers[stage.stage_id].run(request, sources, call)
                closers.append(stream)
            consumers = sum(c.stage_id in run for c in self.pipeline.consumers(stage.stage_id))
            readers = consumers + stage.answers_client
            if readers > 1:
                stream = Broadcast(stream, readers)
                closers.append(stream)
            streams[stage.stage_id] = stream
        client = [(stage, streams[stage.stage_id].tap() if isinstance(streams[stage.stage_id], Broadcast)
                   else streams[stage.stage_id])
                  for stage in self.pipeline.stages if stage.stage_id in run and stage.answers_client]
        return client, closers

    async def outputs(self, ctx: StreamContext,
                      request: dict[str, Any]) -> AsyncIterator[tuple[StageConfig, Outputs]]:
        """What the client's streams give, as it arrives (with the stage it came from); ends when
        every one of them has ended. The stages run are those the adapter does not skip."""
        run = self.pipeline.stages_run(frozenset(self.adapter.skipped_stages(request)) | self.unserved)
        client, closers = self.graph(ctx, request, run)
        text = None
        merged = in_arrival_order(client, lambda stage: stage.stage_id,   # upstream first: a text delta
                                  lambda step: self.wait(ctx, step))      # before the audio it led to
        try:
            if request.get(STREAMING_INPUT):   # registered before the first await: appends may follow at once
                text = self.text_inputs.register(ctx.request_id, ctx.request_streams)
            async for stage, out in merged:
                yield stage, out
        finally:
            await merged.aclose()   # its running steps stop before the streams close
            if text is not None:
                await self.text_inputs.unregister(ctx.request_id, text)
            for closer in reversed(closers):   # the stage streams themselves close with ctx
                await closer.aclose()

    def listened(self, playback: Playback, now: float, duration_s: float) -> None:
        """A chunk leaves for the client: the wait it cost a player, and the stream's first gap."""
        had_gap = not playback.continuous
        wait = playback.arrived(now, duration_s)
        if wait > 0:
            self.metrics.underrun_seconds.increment(wait)
        if had_gap != (not playback.continuous):
            self.metrics.streams_with_gap.increment(1)

    def client_tensor(self, spec: TensorSpec, value: np.ndarray) -> "pb_utils.Tensor":
        """A stage's client output as the entry declares it: a batched stage's leading batch
        dimension of 1 is dropped."""
        if value.ndim == len(spec.dims) + 1 and value.shape[0] == 1:
            value = value[0]
        return pb_utils.Tensor(spec.name, np.ascontiguousarray(value, dtype=spec.numpy_dtype))

    def _stages_ready(self) -> bool:
        return all(pb_utils.is_model_ready(self.pipeline.stage_model_name(stage)) for stage in self.served
                   if stage.stage_id not in self.local_stages)

    def release_resources(self) -> None:
        for local in self.local_stages.values():
            local.close()

    async def stream(self, ctx: StreamContext) -> AsyncIterator[list["pb_utils.Tensor"]]:
        if self.resuming is not None:   # asked of Triton off the loop, until the stages are back
            if not await self.run_blocking(self._stages_ready):
                raise Unavailable(self.resuming)
            self.resuming = None
        text, params = input_bytes(ctx.request, "TEXT") or b"", input_bytes(ctx.request, "PARAMS")
        if params is not None and len(params) > INLINE_VALIDATION_BYTES:
            # a request carrying media (recordings, images): decoding them is CPU work that must
            # not hold the loop every stream of this entry shares
            request = await self.run_blocking(self.adapter.validate, text, params)
        else:
            request = self.adapter.validate(text, params)
        rate = np.array([self.sample_rate], dtype=np.int32)
        first = True
        playback = Playback()   # what a listener of this stream hears, live
        async for stage, out in self.outputs(ctx, request):
            tensors = []
            audio = out["AUDIO"].reshape(-1) if stage.final_output and "AUDIO" in out else None
            if audio is not None and audio.size:
                now = time.perf_counter()
                tensors += [pb_utils.Tensor("AUDIO", np.ascontiguousarray(audio, dtype=np.float32)),
                            pb_utils.Tensor("SAMPLE_RATE", rate)]
            for name in stage.client_outputs:
                value = out.get(name)
                if value is not None and value.size:
                    tensors.append(self.client_tensor(self.client_specs[name], value))
            if tensors:   # never an empty response
                yield tensors
            if audio is not None and audio.size:
                # counted once the chunk has left (the stream resumes after its send): each metric
                # is a round trip to tritonserver, ~0.1-0.2 ms of a busy stub's loop, that the
                # chunk need not wait for; a chunk that never left is not counted
                if first:
                    self.metrics.ttfa_ms.observe((now - ctx.t0) * 1000.0)
                    first = False
                self.metrics.audio_seconds.increment(audio.size / self.sample_rate)
                self.listened(playback, now, audio.size / self.sample_rate)
