"""Stage model for the embedded hibari voice: one AUDIO chunk per sentence (a long one in
parts: `text_chunks`)."""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backend.errors import Cancelled, InvalidRequest
from omni_backend.models.hibari import HibariVoice
from omni_backend.triton.decoupled import StreamContext
from omni_backend.triton.stage import StageModel


class HibariStage(StageModel):
    def load(self) -> None:
        # max_num_seqs is "sentences synthesised at once" (deploy/hibari.yaml); they used to run
        # on the model's shared BLS threads, 16 of them plus those of streams already gone.
        self.voice = HibariVoice(threads=self.stage_deploy.threads,
                                 max_concurrent=self.stage_deploy.max_num_seqs)

    async def generate(self, ctx: StreamContext, request: dict[str, Any],
                       inputs: dict[str, np.ndarray]) -> AsyncIterator[list["pb_utils.Tensor"]]:
        sentences = self.voice.stream(request["text"], voice=request["voice"],
                                      speed=request["speed"], seed=request["seed"])
        chunks = 0
        try:
            while True:
                job = self.voice.executor.submit(next, sentences, None)
                try:
                    audio = await self.wait(ctx, asyncio.wrap_future(job))
                except BaseException:
                    job.cancel()   # still queued behind other streams: it never runs
                    raise
                if audio is None:
                    if chunks == 0:
                        raise InvalidRequest("text", "has nothing to speak (no words after normalization)")
                    return
                chunks += 1
                if ctx.cancelled():
                    raise Cancelled()
                yield [pb_utils.Tensor("AUDIO", np.ascontiguousarray(audio, dtype=np.float32))]
        finally:
            try:
                sentences.close()
            except ValueError:   # a worker is synthesising its sentence now; it drops it after
                pass

    def release_resources(self) -> None:
        self.voice.close()
