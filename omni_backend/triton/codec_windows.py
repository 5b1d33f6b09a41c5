"""A transfer for codec decoders: AR codec frames -> stateless windows -> audio.

The source stage streams frames as it makes them (`CODES`, [frames, codebooks]); the chunk
schedule (omni_backend/chunking.py, the deploy's `async_chunk`) cuts them into windows: a small
first chunk for time to first audio, then `chunk_frames`, each window carrying up to
`left_context_frames` of context. Each window goes to the batched codec stage (`CODES`
[codebooks, frames], `LEFT_CONTEXT`) while the source keeps generating; the codec stage answers
with the new frames' audio only.

A source may first send `CONTEXT_CODES`: frames that precede the generated ones as codec left
context only (a voice prompt's own codes). The schedule counts generated frames; a window's
context reaches back into them; their audio is never emitted.

Families whose frames are shaped otherwise override `frames` (source output -> [n, ...] frames)
and `window` (frames -> the codec stage's inputs).
"""
from __future__ import annotations

from typing import Any, AsyncIterator

import numpy as np

from omni_backend.chunking import CodecChunkSchedule
from omni_backend.triton.transfer import Outputs, SourceReader, StageCall, Transfer


class CodecWindows(Transfer):
    frames_output = "CODES"
    context_output = "CONTEXT_CODES"

    def schedule(self, request: dict[str, Any]) -> CodecChunkSchedule:
        a = self.deploy.async_chunk
        if not a.enabled:  # one window for the whole utterance
            return CodecChunkSchedule(10**9, 10**9, 0)

        def pick(key: str, default: int) -> int:   # per-request overrides the adapter accepted
            return request[key] if request.get(key) is not None else default
        return CodecChunkSchedule(pick("initial_chunk_frames", a.initial_chunk_frames),
                                  pick("chunk_frames", a.chunk_frames),
                                  pick("left_context_frames", a.left_context_frames))

    def frames(self, array: np.ndarray) -> list[np.ndarray]:
        """One source output's frames, oldest first."""
        return list(array.reshape(-1, array.shape[-1]))

    def window(self, frames: list[np.ndarray], left_context: int) -> dict[str, np.ndarray]:
        """The codec stage's inputs for a window whose first `left_context` frames are context."""
        return {"CODES": np.stack(frames, axis=1)[None],                # [1, codebooks, frames]
                "LEFT_CONTEXT": np.array([[left_context]], dtype=np.int32)}

    def audio(self, out: Outputs) -> Outputs:
        return {"AUDIO": out["AUDIO"].reshape(-1)}

    async def run(self, request: dict[str, Any], sources: dict[int, AsyncIterator[Outputs]],
                  stage: StageCall) -> AsyncIterator[Outputs]:
        (source,) = sources.values()
        schedule = self.schedule(request)
        frames: list[np.ndarray] = []      # context frames, then generated frames
        state = {"context": 0}

        def arrived(out: Outputs) -> None:
            if self.context_output in out and not frames:
                frames.extend(self.frames(out[self.context_output]))
                state["context"] = len(frames)
            if self.frames_output in out:
                frames.extend(self.frames(out[self.frames_output]))

        reader = SourceReader(source, arrived)
        emitted = 0

        def next_window():
            return schedule.next_window(emitted, len(frames) - state["context"], reader.finished)
        try:
            while True:
                offset = state["context"]
                window = next_window()
                if window is None:
                    if reader.finished:
                        reader.check()
                        return
                    await reader.more(stage, lambda: next_window() is not None)
                    continue
                # the window's context may reach back into the context frames
                left = min(schedule.left_context_frames, offset + emitted)
                start = offset + emitted - left
                out = await stage.call(self.window(frames[start:offset + window.end_frame], left))
                emitted = window.end_frame
                yield self.audio(out)
        finally:
            await reader.aclose()
