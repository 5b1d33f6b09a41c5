"""Stage 0 of Orpheus: the Llama LM on the torch engine or on vLLM, streaming SNAC codes.

Both engines take the prompt ids (:class:`.tokens.OrpheusPrompt`) and stream one event per
generated token; the token rules (:class:`.tokens.CodeAssembler`) turn tokens into SNAC codes.
Each response carries the whole frames (7 codes each) completed since the last one, CODES [n]
(int64); codes of an unfinished last frame are never sent (no window would use them).

On vLLM the engine lives in its own worker process (omni_backend/engine/vllm_engine.py). If that
worker dies, its streams end with ``unavailable:`` and this stage's stub exits, so the server's
supervisor sees a dead stage: readiness turns false while it reloads the pipeline, which starts
a fresh worker.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backend.engine import AsyncEngine
from omni_backend.errors import PipelineError, Unavailable
from omni_backend.triton.decoupled import StreamContext
from omni_backend.triton.stage import StageModel

from .builtin import resolve_checkpoint
from .sampling import default_params, params_from_request, stop_token_ids
from .tokens import FRAME_TOKENS, CodeAssembler, OrpheusPrompt

logger = logging.getLogger(__name__)


class OrpheusLMStage(StageModel):
    def load(self) -> None:
        sd = self.stage_deploy
        path = resolve_checkpoint(self.model_path)
        self.prompt = OrpheusPrompt(path)
        self.tokens = self.prompt.tokens
        eos = stop_token_ids(path, self.tokens.end_of_speech)
        self.default_params = default_params(sd.default_sampling_params)
        if sd.engine == "vllm":
            from omni_backend.engine.vllm_engine import VLLMEngine, engine_options

            self.engine = VLLMEngine(path, engine_options(sd), eos, default_params=self.default_params,
                                     on_worker_exit=self._worker_exited)
            self.engine.start()
            self.vllm_gauges = self.metrics.engine_gauges()
            asyncio.run_coroutine_threadsafe(self._publish_vllm_counts(), self.loop)
        else:
            from .runner import create_engine

            self.engine = AsyncEngine(create_engine(path, eos, max_num_seqs=sd.max_num_seqs,
                                                    max_model_len=sd.max_model_len, dtype=sd.dtype,
                                                    device=sd.device, num_threads=sd.threads,
                                                    default_params=self.default_params))

    async def _publish_vllm_counts(self, interval_s: float = 0.1) -> None:
        """vLLM's own running / waiting counts as gauges (asked of the worker between its steps)."""
        running, waiting = self.vllm_gauges
        while self.engine.ready:
            try:
                counts = await self.run_blocking(self.engine.running, 2.0)
            except Exception:  # noqa: BLE001 - restarting or closed: the loop condition decides
                await asyncio.sleep(interval_s)
                continue
            running.set(counts.running)
            waiting.set(counts.waiting)
            await asyncio.sleep(interval_s)

    def _worker_exited(self, reason: str) -> None:
        """The vLLM worker died: its streams have ended with `unavailable:`; this stage is dead too
        (the supervisor reloads it, readiness false meanwhile)."""
        logger.error("%s: the vLLM worker exited (%s); this stage exits so it is reloaded", self.model_name, reason)
        # os._exit at once raced the loop thread: the streams' `unavailable` never left
        self.die(Unavailable(f"the vLLM worker {reason}; it is restarting"))

    async def generate(self, ctx: StreamContext, request: dict[str, Any],
                       inputs: dict[str, np.ndarray]) -> AsyncIterator[list["pb_utils.Tensor"]]:
        prompt = self.prompt.ids(request["text"], request.get("voice"))
        params = params_from_request(self.default_params, request)
        stream = self.engine.add_request(ctx.stage_request_id, prompt, params)
        ctx.resources.append(stream)
        codes = CodeAssembler(self.tokens)
        sent = 0
        iterator = stream.__aiter__()
        while True:
            try:
                first = await self.wait(ctx, iterator.__anext__())
            except StopAsyncIteration:
                return
            finished = False
            for event in (first, *stream.drain()):
                if event.finish_reason == "error":
                    raise PipelineError(f"engine: {event.error}")
                if event.codes is not None:
                    codes.feed(event.codes)
                finished = finished or event.finished
            # whole frames only: windows are cut at frame boundaries, and a response per frame
            # instead of per token saves six of every seven hops through Triton
            whole = len(codes.codes) - len(codes.codes) % FRAME_TOKENS
            if whole > sent:
                yield [pb_utils.Tensor("CODES", np.asarray(codes.codes[sent:whole], dtype=np.int64))]
                sent = whole
            if finished:
                return

    def on_cancel(self, ctx: StreamContext) -> None:
        self.engine.cancel(ctx.stage_request_id)

    def release_resources(self) -> None:
        self.engine.close(timeout=2.0)

