"""The entry model's half of a two-stage pipeline: AR codec frames -> codec windows -> audio.

A reader task pulls frames from stage 0 as they are made; the chunk schedule cuts them into
windows (a small first chunk for time to first audio, then `chunk_frames`, each window carrying up
to `left_context_frames` of context); each window is decoded by the codec stage over BLS while
the AR stage keeps generating; the codec stage returns the new frames' audio only.

Stage 0 may send CONTEXT_CODES first (voice cloning in context: the reference recording's codes).
They precede the generated frames as codec left context only: the schedule counts generated
frames, a window's context reaches back into the reference frames, and their audio is never
emitted, which is the reference's "decode ref + new codes, cut the reference part".
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backend.chunking import CodecChunkSchedule
from omni_backend.deploy import DeployConfig
from omni_backend.errors import PipelineError
from omni_backend.triton.bls import StageFailed
from omni_backend.triton.decoupled import StreamContext
from omni_backend.triton.stage_liveness import StageLiveness


def _decode(model_name: str, codes: np.ndarray, left_context: int, request_id: str,
            liveness: StageLiveness) -> np.ndarray:
    request = pb_utils.InferenceRequest(
        model_name=model_name, requested_output_names=["AUDIO"], request_id=request_id,
        inputs=[pb_utils.Tensor("CODES", np.ascontiguousarray(codes[None], dtype=np.int64)),
                pb_utils.Tensor("LEFT_CONTEXT", np.array([[left_context]], dtype=np.int32))])
    response = request.exec()
    liveness.answered(model_name)
    if response.has_error():
        raise StageFailed(response.error().message(), model_name)
    return pb_utils.get_output_tensor_by_name(response, "AUDIO").as_numpy().reshape(-1).copy()


class CodecStreamer:
    def __init__(self, entry: Any, deploy: DeployConfig):
        self.entry = entry
        self.deploy = deploy
        stages = entry.pipeline.stages
        self.codec_model = entry.pipeline.stage_model_name(stages[1])

    async def ping(self, request_id: str) -> None:
        """An empty window: the codec stage answers with no audio (liveness)."""
        await self.entry.run_blocking(_decode, self.codec_model, np.zeros((1, 0), np.int64), 0, request_id,
                                      self.entry.liveness)

    def schedule(self, request: dict[str, Any]) -> CodecChunkSchedule:
        a = self.deploy.async_chunk
        pick = lambda key, default: request.get(key) if request.get(key) is not None else default  # noqa: E731
        if not a.enabled:  # one window for the whole utterance
            return CodecChunkSchedule(10**9, 10**9, 0)
        return CodecChunkSchedule(pick("initial_chunk_frames", a.initial_chunk_frames),
                                  pick("chunk_frames", a.chunk_frames),
                                  pick("left_context_frames", a.left_context_frames))

    async def stream(self, ctx: StreamContext, request: dict[str, Any]) -> AsyncIterator[np.ndarray]:
        schedule = self.schedule(request)
        frames: list[np.ndarray] = []      # context frames, then generated frames
        state = {"finished": False, "error": None, "context": 0}
        arrived = asyncio.Event()
        upstream = self.entry.stage0_stream(ctx, request, ["CODES", "CONTEXT_CODES"])

        async def read() -> None:
            try:
                async for out in upstream:
                    if "CONTEXT_CODES" in out and not frames:
                        context = out["CONTEXT_CODES"]
                        frames.extend(context.reshape(-1, context.shape[-1]))
                        state["context"] = len(frames)
                    if "CODES" in out:
                        frames.extend(out["CODES"].reshape(-1, out["CODES"].shape[-1]))
                    arrived.set()
            except BaseException as e:  # handed to the consumer below
                state["error"] = e
            finally:
                state["finished"] = True
                arrived.set()

        reader = asyncio.ensure_future(read())
        try:
            emitted = 0
            window_no = 0
            while True:
                offset = state["context"]
                window = schedule.next_window(emitted, len(frames) - offset, state["finished"])
                if window is None:
                    if state["finished"]:
                        if isinstance(state["error"], Exception):
                            raise state["error"]
                        return
                    arrived.clear()
                    if schedule.next_window(emitted, len(frames) - state["context"], state["finished"]) is None:
                        await self.entry.wait(ctx, arrived.wait())
                    continue
                # the window's context may reach back into the reference frames
                left = min(schedule.left_context_frames, offset + emitted)
                start = offset + emitted - left
                codes = np.stack(frames[start:offset + window.end_frame], axis=1)  # [q, frames]
                audio = await self.entry.wait(ctx, self.entry.run_blocking(
                    _decode, self.codec_model, codes, left,
                    f"{upstream.request_id}-w{window_no}", self.entry.liveness))
                window_no += 1
                emitted = window.end_frame
                yield audio
        finally:
            if not reader.done():
                await upstream.aclose()
                await asyncio.wait({reader})
