"""Stage 0 of Qwen3-TTS: the talker + code predictor on the continuous-batching AR engine.

One instance hosts one engine; every stream in flight shares its batched steps. Each response
carries the codec frames made since the last one, CODES [frames, 16] (int64).
"""
from __future__ import annotations

import dataclasses
from typing import Any, AsyncIterator

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backend.engine import AsyncEngine, SamplingParams
from omni_backend.errors import PipelineError
from omni_backend.models.qwen3_tts.builtin import resolve_checkpoint
from omni_backend.models.qwen3_tts.runner import create_engine
from omni_backend.triton.decoupled import StreamContext
from omni_backend.triton.stage import StageModel

SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)} - {"seed", "min_new_tokens"}


class Qwen3TalkerStage(StageModel):
    def load(self) -> None:
        sd = self.stage_deploy
        engine = create_engine(resolve_checkpoint(self.model_path), max_num_seqs=sd.max_num_seqs,
                               max_model_len=sd.max_model_len, num_threads=sd.threads, dtype=sd.dtype,
                               device=sd.device)
        self.builder = engine.runner.checkpoint.prompt_builder()
        # Deploy-level sampling defaults override the checkpoint's generation_config.json.
        overrides = dict(sd.default_sampling_params)
        for key, value in sd.subtalker_sampling_params.items():
            overrides[f"subtalker_{key}"] = value
        overrides = {k: v for k, v in overrides.items() if k in SAMPLING_FIELDS}
        self.default_params = dataclasses.replace(engine.default_params, **overrides)
        self.engine = AsyncEngine(engine)

    def sampling_params(self, request: dict[str, Any]) -> SamplingParams:
        values = {k: request[k] for k in SAMPLING_FIELDS if request.get(k) is not None}
        return dataclasses.replace(self.default_params, seed=request.get("seed"), **values)

    async def generate(self, ctx: StreamContext, request: dict[str, Any]) -> AsyncIterator[list["pb_utils.Tensor"]]:
        prompt = self.builder.build(request["text"], speaker=request.get("voice"),
                                    language=request.get("language"), instruct=request.get("instructions"),
                                    non_streaming_mode=request.get("non_streaming_mode"))
        stream = self.engine.add_request(ctx.stage_request_id, prompt, self.sampling_params(request))
        ctx.resources.append(stream)
        iterator = stream.__aiter__()
        while True:
            try:
                event = await self.wait(ctx, iterator.__anext__())
            except StopAsyncIteration:
                return
            if event.finish_reason == "error":
                raise PipelineError(f"engine: {event.error}")
            if event.codes is not None:
                yield [pb_utils.Tensor("CODES", np.asarray([event.codes], dtype=np.int64))]
            if event.finished:
                return

    def on_cancel(self, ctx: StreamContext) -> None:
        self.engine.cancel(ctx.stage_request_id)

    def finalize(self) -> None:
        super().finalize()
        self.engine.close()
