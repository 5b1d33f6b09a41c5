"""The toy family's edges: a stream opened on `shaper` per writer piece, a `render` call per
shaper output."""
from __future__ import annotations

from typing import Any, AsyncIterator

import numpy as np

from omni_backend.triton.transfer import Outputs, StageCall, Transfer


class PieceByPiece(Transfer):
    async def run(self, request: dict[str, Any], sources: dict[int, AsyncIterator[Outputs]],
                  stage: StageCall) -> AsyncIterator[Outputs]:
        async for out in sources[0]:
            async for shaped in stage.stream({"TOKENS": out["TOKENS"]}):
                yield shaped


class RenderEach(Transfer):
    async def run(self, request: dict[str, Any], sources: dict[int, AsyncIterator[Outputs]],
                  stage: StageCall) -> AsyncIterator[Outputs]:
        gain = np.array([[request["gain"]]], dtype=np.float32)
        n = 0
        async for out in sources[1]:
            n += 1
            # the test hooks `block_render_after`, `spin_render_after`: gains no client can ask
            # for (they are >= 0)
            if n == request["block_render_after"] > 0:
                sent = -gain - 1
            elif n == request["spin_render_after"] > 0:
                sent = np.full_like(gain, -np.inf)
            else:
                sent = gain
            yield await stage.call({"FRAMES": out["FRAMES"][None], "GAIN": sent})
