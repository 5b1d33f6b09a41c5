"""Stage model for the embedded hibari voice: one AUDIO chunk per sentence."""
from __future__ import annotations

from typing import Any, AsyncIterator

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backend.errors import Cancelled, InvalidRequest
from omni_backend.models.hibari import HibariVoice
from omni_backend.triton.decoupled import StreamContext
from omni_backend.triton.stage import StageModel


class HibariStage(StageModel):
    def load(self) -> None:
        self.voice = HibariVoice(threads=self.stage_deploy.threads)

    async def generate(self, ctx: StreamContext, request: dict[str, Any]) -> AsyncIterator[list["pb_utils.Tensor"]]:
        sentences = self.voice.stream(request["text"], voice=request["voice"],
                                      speed=request["speed"], seed=request["seed"])
        chunks = 0
        while True:
            audio = await self.wait(ctx, self.run_blocking(next, sentences, None))
            if audio is None:
                if chunks == 0:
                    raise InvalidRequest("text", "has nothing to speak (no words after normalization)")
                return
            chunks += 1
            if ctx.cancelled():
                raise Cancelled()
            yield [pb_utils.Tensor("AUDIO", np.ascontiguousarray(audio, dtype=np.float32))]
