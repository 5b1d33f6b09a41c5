"""Where the talker -> code2wav windows are cut (torch- and Triton-free; see :mod:`.codec_windows`).

A window is ``(start frame, end of its new frames, lookahead frames)``: frames ``[start, end +
lookahead)`` are decoded, the context before ``emitted`` and the lookahead are not heard. Segments
of :data:`REFERENCE_SEGMENT_FRAMES` are the reference's ``chunked_decode`` chunks; a window never
crosses one, and one that ends a segment or the answer has no lookahead.
"""
from __future__ import annotations

__all__ = ["plan_window", "plan_windows", "REFERENCE_SEGMENT_FRAMES", "REFERENCE_SEGMENT_CONTEXT_FRAMES"]

# the reference generate() decodes with chunked_decode(codes, chunk_size=300, left_context_size=25)
REFERENCE_SEGMENT_FRAMES = 300
REFERENCE_SEGMENT_CONTEXT_FRAMES = 25


def plan_window(emitted: int, available: int, finished: bool, first_chunk: int, chunk: int,
                max_context: int, size: int | None = None) -> tuple[int, int, int] | None:
    """The next window ``(start frame, end of new frames, lookahead frames)`` once ``available``
    frames exist and the audio of the first ``emitted`` was produced; None while it cannot be cut
    yet (or nothing is left). ``size``: the new frames the schedule wants here (a growing
    schedule's chunk, :meth:`omni_backend.chunking.CodecChunkSchedule.chunk_size`), by default
    ``first_chunk`` then ``chunk``."""
    segment_start = emitted - emitted % REFERENCE_SEGMENT_FRAMES
    segment_end = segment_start + REFERENCE_SEGMENT_FRAMES
    if size is None:
        size = first_chunk if emitted == 0 else chunk
    end = min(emitted + size, segment_end)
    if finished:
        end = min(end, available)
        if end <= emitted:
            return None
    # a window that ends its segment or the answer has no lookahead; any other needs one more frame
    closes = end == segment_end or (finished and end == available)
    lookahead = 0 if closes else 1
    if end + lookahead > available:
        return None
    context_start = max(0, segment_start - REFERENCE_SEGMENT_CONTEXT_FRAMES) if segment_start else 0
    start = max(context_start, emitted - max_context)
    return start, end, lookahead


def plan_windows(frames: int, first_chunk: int, chunk: int, max_context: int) -> list[tuple[int, int, int]]:
    """Every window of a finished answer of ``frames`` frames, as a stream that ended cuts them."""
    windows, emitted = [], 0
    while (window := plan_window(emitted, frames, True, first_chunk, chunk, max_context)) is not None:
        windows.append(window)
        emitted = window[1]
    return windows
