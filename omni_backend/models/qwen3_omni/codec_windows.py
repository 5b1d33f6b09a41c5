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

Window schedule: the deploy's (``initial_chunk_frames`` new frames first, for time to first
audio, then chunks that grow with ``continuity_rtf`` up to ``chunk_frames``), never across a
segment boundary. The code2wav stage gets CODES
[1, 16, frames], LEFT_CONTEXT (frames of context) and RIGHT_CONTEXT (0 or 1 frame of lookahead).
"""
from __future__ import annotations

import numpy as np

from omni_backend.triton.codec_windows import CodecWindows

from .window_plan import plan_window

__all__ = ["ReferenceChunkWindows"]


class ReferenceChunkWindows(CodecWindows):
    def plan(self, schedule, emitted: int, generated: int, finished: bool, context: int):
        """Windows of :func:`.window_plan.plan_window` (the talker sends no context frames)."""
        return plan_window(emitted, generated, finished, schedule.initial_chunk_frames, schedule.chunk_frames,
                           schedule.left_context_frames, size=schedule.chunk_size(emitted))

    def window(self, frames: list[np.ndarray], left_context: int, lookahead: int = 0) -> dict[str, np.ndarray]:
        out = super().window(frames, left_context)
        out["RIGHT_CONTEXT"] = np.array([[lookahead]], dtype=np.int32)
        return out
