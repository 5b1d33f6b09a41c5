"""Request fields of the toy family."""
from __future__ import annotations

from typing import Any

from omni_backend.adapters.base import Param, TTSAdapter

SHAPER = 1   # stage id; skipping it skips `render`, its consumer


class ToyAdapter(TTSAdapter):
    params = (
        Param("gain", float, default=1.0, lo=0.0, hi=4.0, help="scales the audio"),
        Param("voice", str, default="plain", choices=("plain", "bright"), help="toy voices"),
        Param("return_audio", bool, default=True, help="false: only the writer's text, no audio stages"),
        Param("fail_after", int, default=0, lo=0, hi=1000,
              help="test hook: the writer fails after this many pieces (0: never)"),
        Param("stall_responses_after", int, default=0, lo=0, hi=1000,
              help="test hook: the writer's response thread blocks for good after this many pieces"
                   " (0: never)"),
        Param("block_loop_after", int, default=0, lo=0, hi=1000,
              help="test hook: the writer's event loop blocks for good after this many pieces"
                   " (0: never)"),
        Param("hog_gil_after", int, default=0, lo=0, hi=1000,
              help="test hook: a thread of the writer holds the GIL for good after this many pieces"
                   " (0: never)"),
        Param("spin_loop_after", int, default=0, lo=0, hi=1000,
              help="test hook: the writer's event loop runs one step without end after this many pieces"
                   " (0: never)"),
        Param("block_render_after", int, default=0, lo=0, hi=1000,
              help="test hook: render's batch worker blocks for good at this piece (0: never)"),
        Param("spin_render_after", int, default=0, lo=0, hi=1000,
              help="test hook: render's batch at this piece computes without end (0: never)"),
    )

    def skipped_stages(self, request: dict[str, Any]) -> frozenset[int]:
        return frozenset() if request["return_audio"] else frozenset({SHAPER})
