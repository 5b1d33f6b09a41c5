"""The thinker -> talker edge: one talker stream per request, fed the thinker's tokens while it writes.

The thinker's first output is its prompt ids (and, for a prompt with media, its hidden states at
the placeholders); the talker stream opens with them and the client's request. Each later chunk of ``thinker_chunk_tokens`` tokens (the talker stage's deploy option) is
appended to the running talker stream (``StageCall.append``), the rest with the end of the
answer. Appends are sent one at a time, in order, from a task of their own, so the talker's
frames flow out while the thinker still writes; a thinker that fails ends the talker's stream
with its error.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import numpy as np

from omni_backend.triton.transfer import Outputs, StageCall, Transfer

from .family import TALKER_OPTIONS

_CHUNK = TALKER_OPTIONS[0]


class AnswerHandoff(Transfer):
    @property
    def chunk_tokens(self) -> int:
        value = self.deploy.stage(self.stage.stage_id).options.get(_CHUNK.name)
        return int(value or _CHUNK.default)

    async def run(self, request: dict[str, Any], sources: dict[int, AsyncIterator[Outputs]],
                  stage: StageCall) -> AsyncIterator[Outputs]:
        (source,) = sources.values()
        thinker = source.__aiter__()
        first = await stage.wait(thinker.__anext__())
        if "PROMPT_IDS" not in first:
            raise RuntimeError("the thinker's first output must carry PROMPT_IDS")
        opening = {name: first[name] for name in ("PROMPT_IDS", "PROMPT_HIDDEN", "PROMPT_GRIDS")
                   if name in first}
        talker = stage.stream(opening, request=request)
        feeder = asyncio.ensure_future(self._feed(thinker, talker, stage))
        frames = talker.__aiter__()
        step: asyncio.Future | None = None
        try:
            while True:
                step = asyncio.ensure_future(frames.__anext__())
                while not step.done():
                    watch = {step} if feeder.done() else {step, feeder}
                    await stage.wait(asyncio.wait(watch, return_when=asyncio.FIRST_COMPLETED))
                    if feeder.done() and not feeder.cancelled() and feeder.exception() is not None:
                        raise feeder.exception()
                try:
                    out = step.result()
                except StopAsyncIteration:
                    return
                step = None
                yield out
        finally:
            for task in (step, feeder):
                if task is not None and not task.done():
                    task.cancel()
                    await asyncio.wait({task})
                if task is not None and not task.cancelled():
                    task.exception()   # an outcome nobody reads now (the client left): marked read

    async def _feed(self, thinker: AsyncIterator[Outputs], talker, stage: StageCall) -> None:
        chunk = self.chunk_tokens
        pending: list[np.ndarray] = []
        count = 0
        async for out in thinker:
            ids = out.get("TOKEN_IDS")
            if ids is None or not ids.size:
                continue
            pending.append(ids.reshape(-1))
            count += ids.size
            if count >= chunk:
                await stage.append(talker, {"TOKEN_IDS": np.concatenate(pending)})
                pending, count = [], 0
        tail = np.concatenate(pending) if pending else np.zeros(0, np.int64)
        await stage.append(talker, {"TOKEN_IDS": tail}, end=True)
