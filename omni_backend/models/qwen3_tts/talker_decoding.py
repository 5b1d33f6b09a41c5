"""code2wav inside the talker's process: the talker stage decodes its own codec windows.

A deploy choice (the talker stage's option ``code2wav: in_talker``). By default (``own_stage``)
the talker streams codec frames, the entry cuts them into windows (CodecWindows) and calls the
code2wav stage for each, which batches windows across streams in its own process. That costs
the first chunk two process hops more (entry -> code2wav -> entry, and Triton's batcher wait),
which on a small model is as much as the compute. In the talker the windows are cut by the same
schedule and decoded by the same decoder (Float32, the code2wav stage's device and
batch_invariant setting), one stream's windows at a time, in the engine's thread right after the
step that completed a window (AsyncEngine's `after_event`), in turn with the steps rather than
in a worker thread contending with them for the GIL (that first version gave first audio 81 ms
against 58 own_stage on the tiny random checkpoint). The talker then streams AUDIO and the
entry's transfer hands it on. The samples are the same either way: only the process that
computes them changes. On a GPU the decoder replays CUDA graphs of the schedule's window shapes at
batch 1, as the code2wav stage does at its batch sizes.
"""
from __future__ import annotations

import os
from collections import deque
from typing import Any, Callable

import numpy as np
import torch

from omni_backend.chunking import CodecChunkSchedule
from omni_backend.deploy import DeployConfig
from omni_backend.pipeline import PipelineConfig


class TalkerWindows:
    """The codec decoder and the code2wav stage's window plan, for a talker stage that decodes."""

    def __init__(self, pipeline: PipelineConfig, deploy: DeployConfig, checkpoint_path: str):
        from omni_backend.models.qwen3_tts.code2wav import Code2Wav

        code2wav = next(s for s in pipeline.stages if s.model_stage == "code2wav")
        sd = deploy.stage(code2wav.stage_id)
        self.async_chunk = deploy.async_chunk
        self.decoder = Code2Wav.from_checkpoint(os.path.join(checkpoint_path, "speech_tokenizer"), device=sd.device,
                                                batch_invariant=sd.batch_invariant)
        self.decode_window = self.decoder.decode_window
        if self.decoder.device.type == "cuda" and not sd.enforce_eager:
            # as the code2wav stage does, at batch 1: this process decodes one stream's window at a time
            from omni_backend.models.qwen3_tts.code2wav import captured_window_decoder

            self.decode_window = captured_window_decoder(self.decoder,
                                                         self.async_chunk.chunk_schedule().full_window_shapes(), (1,))

    def schedule(self, request: dict[str, Any]) -> CodecChunkSchedule:
        """The request's chunk schedule, as the entry's CodecWindows cuts it for the code2wav stage."""
        if not self.async_chunk.enabled:   # one window for the whole utterance
            return CodecChunkSchedule(10**9, 10**9, 0)
        return self.async_chunk.chunk_schedule(request.get("initial_chunk_frames"), request.get("chunk_frames"),
                                               request.get("left_context_frames"))

    def decode(self, frames: list[np.ndarray], left_context: int) -> np.ndarray:
        """The new frames' audio of one window (its first `left_context` frames are context)."""
        codes = torch.from_numpy(np.stack(frames, axis=1)[None].astype(np.int64))   # [1, 16, frames]
        with torch.inference_mode():
            return self.decode_window(codes.to(self.decoder.device), left_context)[0].float().cpu().numpy()

    def cutter(self, request: dict[str, Any], context: np.ndarray | None,
               first_window_if: Callable[[Any], bool] | None = None) -> "WindowCutter":
        """One request's window cutting and decoding, fed its engine events (in the engine thread).
        With `first_window_if`, only the first window is decoded here, and only if it says yes
        (given the event that completes that window); every later window is code2wav's, and every
        frame is streamed (those before the first window with the event that completes it)."""
        return WindowCutter(self, request, context, first_window_if)


class WindowCutter:
    """Collects one request's frames and decodes each window the schedule cuts as soon as its last
    frame exists; `take()` hands the audio made so far to the request's event loop, each with the
    span of generated frames it is the audio of."""

    def __init__(self, windows: TalkerWindows, request: dict[str, Any], context: np.ndarray | None,
                 first_window_if: Callable[[Any], bool] | None = None):
        self.windows = windows
        self.schedule = windows.schedule(request)
        self.held: list[np.ndarray] = [] if context is None else list(context)
        self.first = len(self.held)   # context frames: codec context only, never heard
        self.emitted = 0
        self.first_window_if = first_window_if
        self.ready: deque[tuple[int, int, np.ndarray]] = deque()
        # with `first_window_if`: frames before the first window, whose events are not delivered
        # (the stream is woken once, by the event that completes that window, as `in_talker` is)
        self.withheld: deque[tuple[int, np.ndarray]] = deque()

    @property
    def done(self) -> bool:
        """Nothing more to decode here: the first window is cut and the rest are code2wav's."""
        return self.first_window_if is not None and self.emitted > 0

    def __call__(self, event: Any) -> bool:
        """An engine event of the request (engine thread): its frame, and the windows it completes;
        whether the event must reach the stream now: it brought audio; or, with `first_window_if`,
        the first window is cut (its frames, `withheld_before` its index, go with it), or past;
        its end always does."""
        if self.done:   # no frame held, no window cut: a little less of the engine thread per step
            return True
        frame = None if event.codes is None else np.asarray(event.codes, dtype=np.int64)
        if frame is not None:
            self.held.append(frame)
        if event.finished and event.finish_reason not in ("stop", "length"):
            return True   # cancelled, failed or timed out: nobody hears the rest
        while not self.done and (window := self.schedule.next_window(self.emitted, len(self.held) - self.first,
                                                                     event.finished)) is not None:
            if self.first_window_if is None or self.first_window_if(event):
                # the context reaches back into the context frames, as in CodecWindows.plan
                left = min(self.schedule.left_context_frames, self.first + self.emitted)
                start = self.first + self.emitted - left
                audio = self.windows.decode(self.held[start:self.first + window.end_frame], left)
                self.ready.append((self.emitted, window.end_frame, audio))
            self.emitted = window.end_frame
        if self.done:
            self.held = []
        if self.first_window_if is None:
            return bool(self.ready)
        if not self.done and not event.finished and frame is not None:
            self.withheld.append((event.index, frame))
            return False
        return True

    def withheld_before(self, index: int) -> list[np.ndarray]:
        """The frames of the events not delivered, up to frame `index` (the delivered event's),
        oldest first (thread-safe: deque pops)."""
        out = []
        while self.withheld and self.withheld[0][0] < index:
            out.append(self.withheld.popleft()[1])
        return out

    def take(self) -> list[tuple[int, int, np.ndarray]]:
        """(first frame, end frame, their audio) decoded so far and not yet taken, in order
        (thread-safe: deque pops)."""
        out = []
        while self.ready:
            out.append(self.ready.popleft())
        return out
