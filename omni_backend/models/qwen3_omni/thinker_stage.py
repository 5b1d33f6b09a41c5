"""Stage 0 of Qwen3-Omni: the thinker on the continuous-batching AR engine.

The first response carries the prompt's ids (PROMPT_IDS: the talker builds its input from them)
and, for a prompt with media whose speech is wanted, the thinker's hidden state
``accept_hidden_layer`` at the placeholders (PROMPT_HIDDEN [placeholders, hidden], float32: the
talker reads it there) with PROMPT_GRIDS (each image's (t, h, w) patch grid: the talker's rotary
positions follow it); they come once the prefill ran (the audio tower and the vision encoder
encode the recordings and images in it). Then each engine frame (one token) gives TOKEN_IDS and the text it completes (TEXT_DELTA; held back
while a character is incomplete). The last response carries FINISH_REASON (``stop`` at
``<|im_end|>``, ``length`` at ``max_tokens``); on ``stop`` its TOKEN_IDS end with ``<|im_end|>``:
the talker reads every answer token but the last, as the reference does.
"""
from __future__ import annotations

import dataclasses
from typing import Any, AsyncIterator

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backend.engine import AsyncEngine, SamplingParams
from omni_backend.engine.sequence import PromptTooLongError
from omni_backend.errors import InvalidRequest
from omni_backend.triton.decoupled import StreamContext, bytes_tensor
from omni_backend.triton.stage import StageModel

# request field -> engine parameter
SAMPLING_FIELDS = {"max_tokens": "max_new_tokens", "do_sample": "do_sample", "temperature": "temperature",
                   "top_k": "top_k", "top_p": "top_p", "repetition_penalty": "repetition_penalty", "seed": "seed"}
# the engine's defaults when the deploy names none: greedy, no penalty
THINKER_DEFAULTS = SamplingParams(do_sample=False, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0,
                                  max_new_tokens=1024, min_new_tokens=0)


def _ids(name: str, ids: list[int]) -> "pb_utils.Tensor":
    return pb_utils.Tensor(name, np.asarray(ids, dtype=np.int64))


class ThinkerStage(StageModel):
    def load(self) -> None:
        import torch

        from .builtin import resolve_checkpoint
        from .checkpoint import load_checkpoint
        from .engines import create_thinker_engine

        sd = self.stage_deploy
        torch.set_num_threads(sd.threads)
        checkpoint = load_checkpoint(resolve_checkpoint(self.model_path), dtype=sd.dtype, device=sd.device,
                                     parts=("thinker", "audio_tower", "visual"))
        talker = checkpoint.config.talker   # None: a checkpoint that does not speak
        self.hidden_layer = talker.accept_hidden_layer if talker is not None else None
        self.builder = checkpoint.prompt_builder()
        self.tokenizer = checkpoint.tokenizer
        self.eos_id = checkpoint.config.im_end_token_id
        self.default_params = dataclasses.replace(THINKER_DEFAULTS, **sd.default_sampling_params).validate()
        self.engine = AsyncEngine(create_thinker_engine(
            checkpoint, max_num_seqs=sd.max_num_seqs, max_model_len=sd.max_model_len, num_threads=sd.threads,
            max_prefills_per_step=sd.max_prefills_per_step, default_params=self.default_params,
            batch_mode=sd.options.get("batch_mode") or "exact", cuda_graph_sizes=sd.cuda_graph_sizes,
            enforce_eager=sd.enforce_eager))

    def sampling_params(self, request: dict[str, Any]) -> SamplingParams:
        given = {param: request[field] for field, param in SAMPLING_FIELDS.items() if request.get(field) is not None}
        if request.get("ignore_eos"):   # the end of the turn is held back for every token allowed
            given["min_new_tokens"] = given.get("max_new_tokens", self.default_params.max_new_tokens)
        return dataclasses.replace(self.default_params, **given).validate()

    async def generate(self, ctx: StreamContext, request: dict[str, Any],
                       inputs: dict[str, np.ndarray]) -> AsyncIterator[list["pb_utils.Tensor"]]:
        from .stop_strings import StopStrings
        from .text_deltas import TextDeltas

        rid = ctx.stage_request_id
        # decoding and resampling recordings, and their features, are CPU work: off the loop
        prompt = await self.run_blocking(lambda: self.builder.build_prompt(messages=request["messages"],
                                                                           system=request.get("system")))
        # the talker reads hidden states at the placeholders only when it runs
        hidden_wanted = prompt.multimodal and request.get("return_audio", True) and self.hidden_layer is not None
        prompt.hidden_layer = self.hidden_layer if hidden_wanted else None
        try:
            stream = self.engine.add_request(rid, prompt, self.sampling_params(request))
        except PromptTooLongError as e:   # the client's field is the conversation, not the engine's input
            raise InvalidRequest("messages", e.reason) from None
        ctx.resources.append(stream)
        if not hidden_wanted:
            yield [_ids("PROMPT_IDS", prompt.ids)]
        text = TextDeltas(self.tokenizer)
        stops = StopStrings(request["stop"]) if request.get("stop") else None
        first = hidden_wanted
        async for event in self.engine_events(ctx, stream):
            if first and event.finish_reason != "cancelled":
                first = False   # the prefill ran: its hidden states are there
                grids = np.asarray([image.grid for image in prompt.images], dtype=np.int64).reshape(-1, 3)
                yield [_ids("PROMPT_IDS", prompt.ids),
                       pb_utils.Tensor("PROMPT_HIDDEN", prompt.media_hidden.numpy().astype(np.float32)),
                       pb_utils.Tensor("PROMPT_GRIDS", grids)]
            if event.finish_reason == "cancelled":
                return
            ids = list(event.codes or [])
            if event.finish_reason == "stop":
                ids.append(self.eos_id)
            tensors = [_ids("TOKEN_IDS", ids)] if ids else []
            delta = text.add(ids, last=event.finished)
            if stops is not None:
                delta = stops.feed(delta, last=event.finished)
            if delta:
                tensors.append(bytes_tensor("TEXT_DELTA", delta))
            if stops is not None and stops.stopped:   # returning cancels the rest of the answer
                yield tensors + [bytes_tensor("FINISH_REASON", "stop")]
                return
            if event.finished:
                tensors.append(bytes_tensor("FINISH_REASON", event.finish_reason or "stop"))
            if tensors:
                yield tensors

    def on_cancel(self, ctx: StreamContext) -> None:
        self.engine.cancel(ctx.stage_request_id)

    def release_resources(self) -> None:
        self.engine.close(timeout=2.0)
