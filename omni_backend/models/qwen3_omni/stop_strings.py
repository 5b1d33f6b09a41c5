"""Stop sequences (OpenAI's `stop`) over the thinker's text deltas.

The answer ends at the first place any stop string appears; the stop string itself and what
follows are not handed out (OpenAI's and vLLM's behaviour). A stop string can straddle deltas, so
the end of the text that could still begin one is held back until the next delta decides; when
the answer ends without a stop string, that tail goes out with the last delta.
"""
from __future__ import annotations

from typing import Sequence

__all__ = ["StopStrings", "MAX_STOP_STRINGS", "MAX_STOP_CHARS"]

MAX_STOP_STRINGS = 4     # as OpenAI's chat API
MAX_STOP_CHARS = 256


class StopStrings:
    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self.held = ""        # text not handed out yet: it may begin a stop string
        self.stopped = False

    def feed(self, delta: str, last: bool = False) -> str:
        """The part of ``delta`` (with what was held back) that may go out now; sets ``stopped``
        once a stop string appeared (nothing after it goes out)."""
        if self.stopped:
            return ""
        text = self.held + delta
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped, self.held = True, ""
            return text[:min(hits)]
        if last:
            self.held = ""
            return text
        keep = max((n for s in self.stops for n in range(min(len(s) - 1, len(text)), 0, -1)
                    if text.endswith(s[:n])), default=0)
        self.held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]
