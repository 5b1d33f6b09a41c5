"""A transfer for codec decoders: AR codec frames -> stateless windows -> audio.

The source stage streams frames as it makes them (`CODES`, [frames, codebooks]); the chunk
schedule (omni_backend/chunking.py, the deploy's `async_chunk`) cuts them into windows: a small
first chunk for time to first audio, then chunks that grow to `chunk_frames` (each made while
the audio before it plays: `growing_chunks`), each window carrying up to `left_context_frames` of
context. Each window goes to the batched codec stage (`CODES`
[codebooks, frames], `LEFT_CONTEXT`) while the source keeps generating; the codec stage answers
with the new frames' audio only.

A source may first send `CONTEXT_CODES`: frames that precede the generated ones as codec left
context only (a voice prompt's own codes). The schedule counts generated frames; a window's
context reaches back into them; their audio is never emitted.

A source that decodes its own windows (a deploy that runs the codec in the AR stage's process)
sends `AUDIO` instead of frames: it is handed on as it arrives, the codec stage not called. A
source that decodes some of them sends frames and, with the audio of each window it decoded, its
span `AUDIO_SPAN` (first, end generated frame), no later than the frame that completes it: that
window is handed on in its turn, the others go to the codec stage.

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
    audio_output = "AUDIO"   # a source that decodes its own windows
    audio_span_output = "AUDIO_SPAN"   # ... some of them: which frames its AUDIO is of

    def schedule(self, request: dict[str, Any]) -> CodecChunkSchedule:
        a = self.deploy.async_chunk
        if not a.enabled:  # one window for the whole utterance
            return CodecChunkSchedule(10**9, 10**9, 0)

        # per-request overrides the adapter accepted; the deploy says whether chunks grow
        return a.chunk_schedule(request.get("initial_chunk_frames"), request.get("chunk_frames"),
                                request.get("left_context_frames"))

    def frames(self, array: np.ndarray) -> list[np.ndarray]:
        """One source output's frames, oldest first."""
        return list(array.reshape(-1, array.shape[-1]))

    def plan(self, schedule: CodecChunkSchedule, emitted: int, generated: int, finished: bool,
             context: int) -> tuple[int, int, int] | None:
        """The next window once `generated` frames were made (after `context` context frames) and
        the audio of the first `emitted` was produced: (its first frame, counting the context
        frames; the end of its new frames, in generated frames; frames of lookahead after them), or
        None while it cannot be cut yet or nothing is left. Here: the chunk schedule, no lookahead;
        the context may reach back into the context frames."""
        window = schedule.next_window(emitted, generated, finished)
        if window is None:
            return None
        left = min(schedule.left_context_frames, context + emitted)
        return context + emitted - left, window.end_frame, 0

    def window(self, frames: list[np.ndarray], left_context: int, lookahead: int = 0) -> dict[str, np.ndarray]:
        """The codec stage's inputs for a window whose first `left_context` frames are context
        (and, for families that plan lookahead, whose last `lookahead` frames are not heard)."""
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
        decoded: list[np.ndarray] = []     # audio the source decoded itself, not yet handed on
        spans: dict[int, tuple[int, np.ndarray]] = {}   # first frame -> (end frame, audio) the source decoded

        def arrived(out: Outputs) -> None:
            if self.audio_output in out and out[self.audio_output].size:
                if self.audio_span_output in out:
                    first, end = (int(v) for v in out[self.audio_span_output].reshape(-1)[:2])
                    spans[first] = (end, out[self.audio_output].reshape(-1))
                else:
                    decoded.append(out[self.audio_output].reshape(-1))
            if self.context_output in out and not frames:
                frames.extend(self.frames(out[self.context_output]))
                state["context"] = len(frames)
            if self.frames_output in out:
                frames.extend(self.frames(out[self.frames_output]))

        reader = SourceReader(source, arrived)
        emitted = 0

        def next_window():
            context = state["context"]
            return self.plan(schedule, emitted, len(frames) - context, reader.finished, context)
        try:
            while True:
                if decoded:
                    yield {"AUDIO": decoded.pop(0)}
                    continue
                if emitted in spans:   # the source decoded the next window itself
                    emitted, audio = spans.pop(emitted)
                    yield {"AUDIO": audio}
                    continue
                window = next_window()
                if window is None:
                    if reader.finished:
                        reader.check()
                        if spans:
                            raise RuntimeError(f"the source decoded frames {sorted(spans)} on, which "
                                               f"do not follow the {emitted} handed on")
                        return
                    await reader.more(stage, lambda: bool(decoded) or emitted in spans or next_window() is not None)
                    continue
                start, end, lookahead = window
                first_new = state["context"] + emitted
                out = await stage.call(self.window(frames[start:state["context"] + end + lookahead],
                                                   first_new - start, lookahead))
                emitted = end
                yield self.audio(out)
        finally:
            await reader.aclose()
