"""code2wav inside the talker's process: the talker stage decodes its own codec windows.

A deploy choice (the talker stage's option ``code2wav: in_talker``). By default (``own_stage``)
the talker streams codec frames, the entry cuts them into windows (CodecWindows) and calls the
code2wav stage for each, which batches windows across streams in its own process. That costs
the first chunk two process hops more (entry -> code2wav -> entry, and Triton's batcher wait),
which on a small model is as much as the compute. In the talker the windows are cut by the same
schedule and decoded by the same decoder (Float32, the code2wav stage's device and
batch_invariant setting), one stream's windows at a time, in a worker thread while the engine
keeps stepping; the talker then streams AUDIO and the entry's transfer hands it on. The samples
are the same either way: only the process that computes them changes.
"""
from __future__ import annotations

import os
from typing import Any, AsyncIterator, Callable

import numpy as np
import torch

from omni_backend.deploy import DeployConfig
from omni_backend.pipeline import PipelineConfig


class TalkerWindows:
    """The codec decoder and the code2wav stage's window plan, for a talker stage that decodes."""

    def __init__(self, pipeline: PipelineConfig, deploy: DeployConfig, checkpoint_path: str):
        from omni_backend.models.qwen3_tts.code2wav import Code2Wav
        from omni_backend.triton.codec_windows import CodecWindows

        code2wav = next(s for s in pipeline.stages if s.model_stage == "code2wav")
        sd = deploy.stage(code2wav.stage_id)
        self.plan = CodecWindows(pipeline, code2wav, deploy)   # the entry's own window plan
        self.decoder = Code2Wav.from_checkpoint(os.path.join(checkpoint_path, "speech_tokenizer"), device=sd.device,
                                                batch_invariant=sd.batch_invariant)

    def decode(self, frames: list[np.ndarray], left_context: int) -> np.ndarray:
        """The new frames' audio of one window (its first `left_context` frames are context)."""
        codes = torch.from_numpy(np.stack(frames, axis=1)[None].astype(np.int64))   # [1, 16, frames]
        with torch.inference_mode():
            return self.decoder.decode_window(codes.to(self.decoder.device), left_context)[0].float().cpu().numpy()

    async def audio(self, request: dict[str, Any], context: np.ndarray | None, frames: AsyncIterator[np.ndarray],
                    run: Callable) -> AsyncIterator[np.ndarray]:
        """Audio chunks of one request as its schedule cuts them: `frames` gives the generated
        frames ([16] each) as the engine makes them, `context` the frames before them that are
        codec context only (a voice prompt's codes), `run(fn, *args)` awaits a blocking call off
        the stage's event loop."""
        schedule = self.plan.schedule(request)
        held: list[np.ndarray] = [] if context is None else list(context)
        first = len(held)
        emitted, finished = 0, False
        iterator = frames.__aiter__()
        while True:
            window = self.plan.plan(schedule, emitted, len(held) - first, finished, first)
            if window is None:
                if finished:
                    return
                try:
                    held.append(await iterator.__anext__())
                except StopAsyncIteration:
                    finished = True
                continue
            start, end, _ = window
            yield await run(self.decode, held[start:first + end], first + emitted - start)
            emitted = end
