"""Stage 1 of Qwen3-Omni: the talker + code predictor on the continuous-batching AR engine, fed the
thinker's answer while the thinker writes it.

A stream opens with the thinker's PROMPT_IDS (with PROMPT_HIDDEN and PROMPT_GRIDS for a prompt
with media, and maybe its first TOKEN_IDS) and the client's
request (speaker, talker sampling); the rest of the answer comes as ``CONTROL=append`` with
TOKEN_IDS, the end of the answer with ``end`` (:class:`~.answer_handoff.AnswerHandoff`). The request
enters the engine once the talker's prefill can be built; from then on the tokens go to the engine
(``append_input``), where a request that has read all the text that arrived waits, holding its
slot, while the others step. One that waits longer than the deploy's ``text_wait_s`` (for its
prefill, or for more text while running) ends with ``unavailable: ...``: the thinker stalled.
Each response carries one codec frame, CODES [1, 16] (int64).
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, AsyncIterator

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backend.engine import AsyncEngine, SamplingParams
from omni_backend.errors import InvalidRequest, Unavailable
from omni_backend.triton.decoupled import StreamContext
from omni_backend.triton.stage import ForgetOnRelease, StageModel

from .config import SPEECHLESS, load_config
from .family import TALKER_OPTIONS


_TEXT_WAIT = TALKER_OPTIONS[1]
# request field -> engine parameter
SAMPLING_FIELDS = {"talker_do_sample": "do_sample", "talker_temperature": "temperature", "talker_top_k": "top_k",
                   "talker_top_p": "top_p", "talker_repetition_penalty": "repetition_penalty",
                   "talker_max_new_tokens": "max_new_tokens", "seed": "seed"}


class AnswerFeed:
    """One stream's thinker tokens: into its :class:`~.talker_runner.ThinkerAnswer` until the
    request is in the engine, then to the engine."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.ready = asyncio.Event()   # the talker's prefill can be built
        self.ended = False
        self.engine: AsyncEngine | None = None
        self.request_id = ""

    def push(self, ids: list[int], end: bool) -> None:
        if self.ended:
            raise InvalidRequest("TOKEN_IDS", "the thinker's answer has already ended")
        self.ended = end
        if self.engine is not None:
            self.engine.append_input(self.request_id, ids, end=end)
            return
        self.answer.push(ids)
        if end:
            self.answer.end()
        if self.answer.ready:
            self.ready.set()

    def attach(self, engine: AsyncEngine, request_id: str) -> None:
        self.engine, self.request_id = engine, request_id


class TalkerStage(StageModel):
    def load(self) -> None:
        import torch

        from .builtin import resolve_checkpoint
        from .checkpoint import load_checkpoint, load_thinker_embedding
        from .engines import create_talker_engine
        from .talker_runner import talker_sampling_defaults

        sd = self.stage_deploy
        torch.set_num_threads(sd.threads)
        path = resolve_checkpoint(self.model_path)
        self.engine = None
        if load_config(path).talker is None:   # the builder writes no talker model for it
            raise ValueError(f"{self.model_name}: {SPEECHLESS}; rebuild the repository")
        checkpoint = load_checkpoint(path, dtype=sd.dtype, device=sd.device, parts=("talker",))
        self.config, self.talker = checkpoint.config, checkpoint.talker
        self.embedding = load_thinker_embedding(path, dtype=sd.dtype, device=sd.device)
        self.text_wait_s = float(sd.options.get(_TEXT_WAIT.name) or _TEXT_WAIT.default)
        self.default_params = dataclasses.replace(talker_sampling_defaults(), **sd.default_sampling_params).validate()
        self.engine = AsyncEngine(create_talker_engine(
            self.talker, max_num_seqs=sd.max_num_seqs, max_model_len=sd.max_model_len, num_threads=sd.threads,
            max_prefills_per_step=sd.max_prefills_per_step, default_params=self.default_params,
            max_input_wait_s=self.text_wait_s, batch_mode=sd.options.get("batch_mode") or "exact",
            cuda_graph_sizes=sd.cuda_graph_sizes, enforce_eager=sd.enforce_eager))
        self.feeds: dict[str, AnswerFeed] = {}

    def sampling_params(self, request: dict[str, Any]) -> SamplingParams:
        given = {param: request[field] for field, param in SAMPLING_FIELDS.items() if request.get(field) is not None}
        return dataclasses.replace(self.default_params, **given).validate()

    def _timeout(self, waited: str) -> Unavailable:
        return Unavailable(f"talker: {waited} for {self.text_wait_s:g} s and the thinker's answer did not "
                           "come (text_wait_s)")

    async def generate(self, ctx: StreamContext, request: dict[str, Any] | None,
                       inputs: dict[str, np.ndarray]) -> AsyncIterator[list["pb_utils.Tensor"]]:
        import torch

        from .prompt import TalkerInput
        from .talker_runner import ThinkerAnswer

        if request is None or "PROMPT_IDS" not in inputs:
            raise InvalidRequest("PROMPT_IDS", "the talker is opened with the thinker's prompt ids and the request")
        rid = ctx.stage_request_id
        prompt = inputs["PROMPT_IDS"].reshape(-1).tolist()
        hidden = inputs.get("PROMPT_HIDDEN")
        grids = inputs.get("PROMPT_GRIDS")
        talker_input = TalkerInput(self.config, self.embedding, self.talker, prompt, request.get("speaker", ""),
                                   prompt_hidden=None if hidden is None else torch.from_numpy(np.array(hidden)),
                                   image_grids=[] if grids is None else np.asarray(grids).reshape(-1, 3).tolist())
        feed = self.feeds[rid] = AnswerFeed(ThinkerAnswer(talker_input))   # before any await: appends follow
        ctx.resources.append(ForgetOnRelease(self.feeds, rid))
        feed.push(inputs.get("TOKEN_IDS", np.zeros(0, np.int64)).reshape(-1).tolist(), end=False)
        params = self.sampling_params(request)
        try:
            await self.wait(ctx, asyncio.wait_for(feed.ready.wait(), self.text_wait_s))
        except asyncio.TimeoutError:
            raise self._timeout("waited for the start of the answer") from None
        stream = self.engine.add_request(rid, feed.answer, params, input_open=not feed.ended)
        feed.attach(self.engine, rid)
        ctx.resources.append(stream)
        async for event in self.engine_events(ctx, stream):
            if event.finish_reason == "input_timeout":
                raise self._timeout("read all of the answer that arrived and waited")
            if event.codes is not None:
                yield [pb_utils.Tensor("CODES", np.asarray([event.codes], dtype=np.int64))]

    async def on_append_inputs(self, ctx: StreamContext, inputs: dict[str, np.ndarray], end: bool) -> None:
        feed = self.feeds.get(ctx.stage_request_id)
        if feed is None:
            raise InvalidRequest("REQUEST_ID", "this talker stream takes no more tokens")
        feed.push(inputs.get("TOKEN_IDS", np.zeros(0, np.int64)).reshape(-1).tolist(), end)

    def on_cancel(self, ctx: StreamContext) -> None:
        if self.engine is not None:
            self.engine.cancel(ctx.stage_request_id)

    def release_resources(self) -> None:
        if self.engine is not None:
            self.engine.close(timeout=2.0)

