"""The talker -> code2wav edge: codec frames -> streamed windows whose audio is the reference's.

The reference decodes a finished answer with ``chunked_decode(codes, 300, 25)``: segments of 300
frames, each decoded with 25 frames of left context, each losing the decoder's ``trim`` samples
(555) at its end. The decoder is causal, so the audio of any frames of a segment can be decoded
early: a window decodes from the segment's context start (at most ``left_context_frames`` back)
through its new frames plus one frame of lookahead, and keeps the new frames' ``hop_length``
samples each; the last window of a segment (or of the answer) has no lookahead and keeps its
whole tail, losing ``trim`` samples exactly where the reference does. With ``left_context_frames``
>= 325 the windows' concatenation is the reference's waveform (to float rounding); a smaller
value trades exactness for shorter windows.

Window schedule: ``initial_chunk_frames`` new frames first (time to first audio), then
``chunk_frames``, never across a segment boundary. The code2wav stage gets CODES
[1, 16, frames], LEFT_CONTEXT (frames of context) and RIGHT_CONTEXT (0 or 1 frame of lookahead).
"""
from __future__ import annotations

from typing import Any, AsyncIterator

import numpy as np

from omni_backend.triton.codec_windows import CodecWindows
from omni_backend.triton.transfer import Outputs, SourceReader, StageCall

from .window_plan import plan_window

__all__ = ["ReferenceChunkWindows"]


class ReferenceChunkWindows(CodecWindows):
    def window(self, frames: list[np.ndarray], left_context: int, right_context: int = 0) -> dict[str, np.ndarray]:
        out = super().window(frames, left_context)
        out["RIGHT_CONTEXT"] = np.array([[right_context]], dtype=np.int32)
        return out

    async def run(self, request: dict[str, Any], sources: dict[int, AsyncIterator[Outputs]],
                  stage: StageCall) -> AsyncIterator[Outputs]:
        (source,) = sources.values()
        schedule = self.schedule(request)
        frames: list[np.ndarray] = []
        reader = SourceReader(source, lambda out: frames.extend(self.frames(out[self.frames_output]))
                              if self.frames_output in out else None)
        emitted = 0

        def next_window():
            return plan_window(emitted, len(frames), reader.finished, schedule.initial_chunk_frames,
                               schedule.chunk_frames, schedule.left_context_frames)
        try:
            while True:
                window = next_window()
                if window is None:
                    if reader.finished:
                        reader.check()
                        return
                    await reader.more(stage, lambda: next_window() is not None)
                    continue
                start, end, lookahead = window
                out = await stage.call(self.window(frames[start:end + lookahead], emitted - start, lookahead))
                emitted = end
                yield self.audio(out)
        finally:
            await reader.aclose()
