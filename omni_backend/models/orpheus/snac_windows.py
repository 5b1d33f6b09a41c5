"""Orpheus's edge LM -> SNAC: the released 4-frame windows, each decoded for one frame's audio.

After every 7th code, from the 28th on, the last 28 codes (4 frames) go to the SNAC stage, which
answers with the audio of the window's second frame (one frame of left context, two of right
context; ``tokens_decoder`` / ``convert_to_audio`` in orpheus-speech). A window holding a code
outside the codebook gives no audio, as there. Each window's decoder noise is seeded by the
request's seed (0 when it has none) and the window's index, so audio is reproducible and
independent of what the window is batched with. Windows that became ready while a call was out
go together in the next call (one row each).
"""
from __future__ import annotations

from typing import Any, AsyncIterator

import numpy as np

from omni_backend.triton.transfer import Outputs, SourceReader, StageCall, Transfer

from .snac import window_noise_seed
from .tokens import WindowCutter


class SnacWindows(Transfer):
    async def run(self, request: dict[str, Any], sources: dict[int, AsyncIterator[Outputs]],
                  stage: StageCall) -> AsyncIterator[Outputs]:
        (source,) = sources.values()
        seed = request.get("seed") or 0
        cutter = WindowCutter()
        ready: list[tuple[int, list[int]]] = []
        # frames keep coming while a call is out
        reader = SourceReader(source, lambda out: ready.extend(cutter.add(out["CODES"].reshape(-1).tolist())))
        try:
            while True:
                if not ready:
                    if reader.finished:
                        reader.check()
                        return
                    await reader.more(stage, lambda: bool(ready))
                    continue
                # every window that is ready goes in one call (one row each)
                batch, ready[:] = list(ready), []
                answer = await stage.call({
                    "CODES": np.asarray([w for _, w in batch], dtype=np.int64),
                    "NOISE_SEED": np.asarray([[window_noise_seed(seed, i)] for i, _ in batch], dtype=np.int64)})
                yield {"AUDIO": answer["AUDIO"].reshape(-1)}
        finally:
            await reader.aclose()
