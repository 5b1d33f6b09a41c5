"""The toy family's Triton models (loaded only inside Triton's stubs)."""
from __future__ import annotations

import asyncio
import re
import threading
from typing import Any, AsyncIterator, Hashable

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backend.errors import InvalidRequest
from omni_backend.triton.batched_stage import BatchedStage, Inputs
from omni_backend.triton.decoupled import StreamContext, bytes_tensor
from omni_backend.triton.stage import StageModel
from tests.toy_family import PIECE, audio_of, frames_of


class _StuckSender:
    """A response sender whose send never returns: the writer's response thread blocks on it, as
    it would on a tritonserver that stopped taking responses, while the stub's loop runs on."""

    def send(self, *args: Any, **kwargs: Any) -> None:
        threading.Event().wait()


def _hog_gil() -> None:
    """Holds the GIL without end, as a regular expression that backtracks for ever does (the C
    matcher never lets it go): the stub's loop then waits for it while this thread runs."""
    re.fullmatch(r"(a+)+b", "a" * 64)


class Writer(StageModel):
    async def generate(self, ctx: StreamContext, request: dict[str, Any] | None,
                       inputs: dict[str, np.ndarray]) -> AsyncIterator[list["pb_utils.Tensor"]]:
        text = request["text"]
        tokens = np.array([ord(c) for c in text], dtype=np.int64)
        for n, i in enumerate(range(0, len(tokens), PIECE)):
            await asyncio.sleep(0.01)   # a piece at a time, like an AR stage
            if n == request["fail_after"] > 0:
                raise InvalidRequest("fail_after", f"the writer failed as asked after {n} pieces")
            if n == request["stall_responses_after"] > 0:
                self.responses.send(_StuckSender(), None, 0)
            if n == request["block_loop_after"] > 0:
                threading.Event().wait()   # blocks the stub's event loop, as a deadlock would
            if n == request["spin_loop_after"] > 0:
                while True:   # a step that never ends: the loop's thread runs, the loop never ticks
                    pass
            if n == request["hog_gil_after"] > 0:
                threading.Thread(target=_hog_gil, name="gil-hog", daemon=True).start()
            yield [pb_utils.Tensor("TOKENS", tokens[i:i + PIECE]),
                   bytes_tensor("TEXT_DELTA", text[i:i + PIECE])]


class Shaper(StageModel):
    async def generate(self, ctx: StreamContext, request: dict[str, Any] | None,
                       inputs: dict[str, np.ndarray]) -> AsyncIterator[list["pb_utils.Tensor"]]:
        yield [pb_utils.Tensor("FRAMES", frames_of(inputs["TOKENS"].reshape(-1)))]


class Render(BatchedStage):
    def batch_key(self, inputs: Inputs) -> Hashable:
        return inputs["FRAMES"].shape[1:]

    def run_batch(self, batch: list[Inputs]) -> list[dict[str, np.ndarray]]:
        if any(np.isneginf(b["GAIN"]).any() for b in batch):   # RenderEach's `spin_render_after`
            while True:   # the batch computes without end, as a codec in a loop would
                pass
        if any((b["GAIN"] < 0).any() for b in batch):   # RenderEach's `block_render_after` hook
            threading.Event().wait()   # the batch worker blocks, as a deadlock would
        return [{"AUDIO": np.stack([audio_of(f, float(g.reshape(-1)[0]))
                                    for f, g in zip(b["FRAMES"], b["GAIN"])])} for b in batch]
