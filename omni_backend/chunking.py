"""Cutting a stream of codec frames into stateless decoder windows (torch-free).

A window is ``left_context + new`` consecutive frames; the decoder returns audio for the new
frames only (:meth:`omni_backend.models.qwen3_tts.code2wav.Code2Wav.decode_window`). The entry
model runs :meth:`CodecChunkSchedule.next_window` against live frames; in-process decoders replay
:meth:`CodecChunkSchedule.plan` over finished codes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

__all__ = ["CodecChunkSchedule", "CodecWindow", "plan_stream_windows"]


@dataclass(frozen=True)
class CodecWindow:
    """Frames ``[start_frame, end_frame)`` go to the decoder; the first ``left_context_frames``
    of them are context whose audio is dropped."""

    start_frame: int
    left_context_frames: int
    end_frame: int

    @property
    def first_new_frame(self) -> int:
        return self.start_frame + self.left_context_frames

    @property
    def new_frames(self) -> int:
        return self.end_frame - self.first_new_frame

    @property
    def total_frames(self) -> int:
        return self.end_frame - self.start_frame


@dataclass(frozen=True)
class CodecChunkSchedule:
    """When to cut a stream of codec frames into decoder windows.

    ``initial_chunk_frames`` new frames for the first window (small: time to first audio),
    ``chunk_frames`` for each later one, each window with up to ``left_context_frames`` frames
    of context before its new frames. Windows have fixed sizes (the steady state is
    ``left_context_frames + chunk_frames``, 97 by default) so that concurrent streams produce
    equal-length windows, which batch without padding.

    ``continuity_rtf``: a listener must not wait twice. With fixed chunks the second one (25
    frames, 2 s of audio) must be made while the first (2 frames, 160 ms) plays, which a loaded
    engine cannot do. With ``continuity_rtf`` r (0 < r <= 1) the chunks after the first grow with
    the audio already cut, ``e`` frames: the next one has ``initial_chunk_frames + e * (1/r - 1)``
    frames (rounded down), so an engine at a real-time factor up to r makes it while the
    audio before it plays (the frames of one chunk are made in ``(e + chunk) * step``; the
    player, which started after the first chunk's ``initial_chunk_frames * step``, runs out at
    ``e`` frames of audio later), until chunks reach ``chunk_frames``. A grown chunk never
    crosses a cut of the fixed schedule (``initial_chunk_frames + k * chunk_frames``; a remainder
    shorter than the first chunk joins the chunk before it), so once chunks reach
    ``chunk_frames`` the windows, and their audio, are the fixed schedule's. Cut points are a
    function of the frame count only: a request's audio does not depend on timing or load.
    0 keeps fixed chunks.
    """

    initial_chunk_frames: int = 2
    chunk_frames: int = 25
    left_context_frames: int = 72
    continuity_rtf: float = 0.0

    def __post_init__(self) -> None:
        for name in ("initial_chunk_frames", "chunk_frames"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.left_context_frames, int) or self.left_context_frames < 0:
            raise ValueError(f"left_context_frames must be an integer >= 0, got {self.left_context_frames!r}")
        r = self.continuity_rtf
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r <= 1:
            raise ValueError(f"continuity_rtf must be a number in [0, 1], got {r!r}")

    def next_window(self, emitted_frames: int, available_frames: int, finished: bool) -> CodecWindow | None:
        """The next window to decode once ``available_frames`` frames exist and the audio of the
        first ``emitted_frames`` has been produced; ``None`` while the next chunk is incomplete
        (unless ``finished``: then the remainder is flushed) or when nothing is left."""
        if not 0 <= emitted_frames <= available_frames:
            raise ValueError(f"need 0 <= emitted_frames ({emitted_frames}) <= available_frames ({available_frames})")
        chunk = self.chunk_size(emitted_frames)
        pending = available_frames - emitted_frames
        if pending >= chunk:
            new = chunk
        elif finished and pending > 0:
            new = pending
        else:
            return None
        context = min(self.left_context_frames, emitted_frames)
        return CodecWindow(emitted_frames - context, context, emitted_frames + new)

    def chunk_size(self, emitted_frames: int) -> int:
        """New frames of the window that starts at ``emitted_frames`` (a stream's end may cut it
        shorter)."""
        first, chunk = self.initial_chunk_frames, self.chunk_frames
        if emitted_frames == 0:
            return first
        if not self.continuity_rtf:
            return chunk
        # e * (1/r - 1) exactly: 0.75 is 3/4, so 3 frames grow the next chunk by exactly 1
        growth = 1 / Fraction(self.continuity_rtf).limit_denominator(1000) - 1
        size = first + math.floor(emitted_frames * growth)
        past = (emitted_frames - first) % chunk   # frames since the fixed schedule's last cut
        if past == 0 and size >= chunk:
            return chunk                          # on the fixed schedule from here on
        cut = emitted_frames - past + chunk       # its next cut
        end = min(emitted_frames + size, cut)
        if cut - end < first:                     # no chunk shorter than the first
            end = cut
        return end - emitted_frames

    def full_window_shapes(self) -> list[tuple[int, int]]:
        """``(frames, left_context_frames)`` of every full window a stream makes, first to steady
        state (only a stream's last window can have another shape): what a decoder can prepare for."""
        shapes, emitted = [], 0
        while True:
            window = self.next_window(emitted, emitted + self.chunk_frames + self.initial_chunk_frames, False)
            shape = (window.total_frames, window.left_context_frames)
            if shape in shapes:
                return shapes
            shapes.append(shape)
            emitted = window.end_frame

    def plan(self, total_frames: int) -> list[CodecWindow]:
        """All windows of a finished stream of ``total_frames`` frames, in order."""
        windows: list[CodecWindow] = []
        emitted = 0
        while (window := self.next_window(emitted, total_frames, finished=True)) is not None:
            windows.append(window)
            emitted = window.end_frame
        return windows


def plan_stream_windows(total_frames: int, initial_chunk_frames: int = 2, chunk_frames: int = 25,
                        left_context_frames: int = 72, continuity_rtf: float = 0.0) -> list[CodecWindow]:
    """Windows of a stream of ``total_frames`` frames; see :class:`CodecChunkSchedule`."""
    return CodecChunkSchedule(initial_chunk_frames, chunk_frames, left_context_frames,
                              continuity_rtf).plan(total_frames)
