"""Whether an entry's stages answer: a ping succeeds when the stage answers it, or answers any
other request after the ping went out. Under overload a ping can wait behind real work (a codec
stage's batching queue); a stage that keeps answering real work is alive all the same."""
from __future__ import annotations

import asyncio
import time
from typing import Awaitable

from omni_backend.errors import Unavailable
from omni_backend.triton.stream_waits import drop_result


class StageLiveness:
    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def answered(self, model: str) -> None:
        """A stage answered something (any thread)."""
        self._last[model] = time.monotonic()

    async def check(self, model: str, ping: Awaitable, timeout_s: float) -> None:
        """Raise the ping's own error, or Unavailable naming the stage after `timeout_s` of silence."""
        start = time.monotonic()
        fut = asyncio.ensure_future(ping)
        while True:
            await asyncio.wait({fut}, timeout=0.05)
            if fut.done():
                try:
                    fut.result()
                    return
                finally:
                    del fut   # no cycle through a raised error (omni_backend/triton/stream_waits.py)
            if self._last.get(model, 0.0) > start:
                fut.add_done_callback(drop_result)
                return
            if time.monotonic() - start > timeout_s:
                fut.add_done_callback(drop_result)
                raise Unavailable(f"{model}: no answer in {timeout_s:.1f} s")
