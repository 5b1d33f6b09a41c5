"""Cutting a stream of codec frames into stateless decoder windows (torch-free).

A window is ``left_context + new`` consecutive frames; the decoder returns audio for the new
frames only (:meth:`omni_backend.models.qwen3_tts.code2wav.Code2Wav.decode_window`). The entry
model runs :meth:`CodecChunkSchedule.next_window` against live frames; in-process decoders replay
:meth:`CodecChunkSchedule.plan` over finished codes.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    """

    initial_chunk_frames: int = 2
    chunk_frames: int = 25
    left_context_frames: int = 72

    def __post_init__(self) -> None:
        for name in ("initial_chunk_frames", "chunk_frames"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.left_context_frames, int) or self.left_context_frames < 0:
            raise ValueError(f"left_context_frames must be an integer >= 0, got {self.left_context_frames!r}")

    def next_window(self, emitted_frames: int, available_frames: int, finished: bool) -> CodecWindow | None:
        """The next window to decode once ``available_frames`` frames exist and the audio of the
        first ``emitted_frames`` has been produced; ``None`` while the next chunk is incomplete
        (unless ``finished``: then the remainder is flushed) or when nothing is left."""
        if not 0 <= emitted_frames <= available_frames:
            raise ValueError(f"need 0 <= emitted_frames ({emitted_frames}) <= available_frames ({available_frames})")
        chunk = self.initial_chunk_frames if emitted_frames == 0 else self.chunk_frames
        pending = available_frames - emitted_frames
        if pending >= chunk:
            new = chunk
        elif finished and pending > 0:
            new = pending
        else:
            return None
        context = min(self.left_context_frames, emitted_frames)
        return CodecWindow(emitted_frames - context, context, emitted_frames + new)

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
                        left_context_frames: int = 72) -> list[CodecWindow]:
    """Windows of a stream of ``total_frames`` frames; see :class:`CodecChunkSchedule`."""
    return CodecChunkSchedule(initial_chunk_frames, chunk_frames, left_context_frames).plan(total_frames)
