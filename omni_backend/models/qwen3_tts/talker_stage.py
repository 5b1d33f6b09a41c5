"""Stage 0 of Qwen3-TTS: the talker + code predictor on the continuous-batching AR engine.

One instance hosts one engine; every stream in flight shares its batched steps. Each response
carries the codec frames made since the last one, CODES [frames, 16] (int64).

Base (voice clone) checkpoints: the request's ``ref_audio`` is encoded into an x-vector and, in
in-context mode, reference codes; both are cached by (sha256 of the ref_audio payload, mode), so a
voice used again is not re-encoded (``omni_voice_encodings_total`` counts the encodings). In
in-context mode the first response also carries CONTEXT_CODES [ref frames, 16]: the entry decodes
the new frames with them as codec left context (the reference decodes ref + new codes and cuts
the reference part off), and never emits their audio.

Text that arrives in pieces (``streaming_input``): the request's TEXT is the first piece, the rest
come as ``CONTROL=append`` (``on_append``). :class:`~.streamed_text.StreamedText` turns them into
the ids the whole text would get; the request enters the engine once its first text id is final,
and every id that becomes final later goes to the engine (``append_input``), the end of the input
with the last. A request that has read all the text that arrived waits in the engine, holding its
slot; one that waits longer than the deploy's ``text_wait_s`` (for its first id, or for more text
while running) ends with ``invalid_request: text: ...``.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import threading
from collections import OrderedDict
from typing import Any, AsyncIterator, Callable

import numpy as np
import triton_python_backend_utils as pb_utils

from omni_backend.engine import AsyncEngine, SamplingParams
from omni_backend.errors import InvalidRequest, PipelineError
from omni_backend.reference_audio import recording_named_if_too_long
from omni_backend.models.qwen3_tts.builtin import resolve_checkpoint
from omni_backend.models.qwen3_tts.runner import create_engine
from omni_backend.models.qwen3_tts.family import CODE2WAV_PLACEMENT_OPTION, COMPILE_OPTION, TEXT_WAIT_OPTION
from omni_backend.models.qwen3_tts.sampling_params import FIELDS as CODE_PREDICTOR_FIELDS
from omni_backend.models.qwen3_tts.sampling_params import code_predictor_params, sampling_params_from_request
from omni_backend.models.qwen3_tts.streamed_text import StreamedText
from omni_backend.models.qwen3_tts.talker_decoding import TalkerWindows
from omni_backend.triton.decoupled import StreamContext
from omni_backend.triton.stage import ForgetOnRelease, StageModel


class TextFeed:
    """One streaming_input request's text: its tokenizer state, and where its final ids go (the
    engine, once the request is in it)."""

    def __init__(self, streamed: StreamedText):
        self.streamed = streamed
        self.first_id = asyncio.Event()   # the prompt can be built
        self.engine: AsyncEngine | None = None
        self.request_id = ""
        self.sent = 0                     # ids handed to the engine (or put in the prompt)

    def push(self, text: str, end: bool) -> None:
        self.streamed.push(text)
        if end:
            self.streamed.finish()
        if self.streamed.text_ids or self.streamed.ended:
            self.first_id.set()
        self.forward()

    def attach(self, engine: AsyncEngine, request_id: str, in_prompt: int) -> None:
        self.engine, self.request_id, self.sent = engine, request_id, in_prompt
        self.forward()

    def forward(self) -> None:
        if self.engine is None:
            return
        ids = self.streamed.ids
        if len(ids) > self.sent or self.streamed.ended:
            self.engine.append_input(self.request_id, ids[self.sent:], end=self.streamed.ended)
            self.sent = len(ids)


class Qwen3TalkerStage(StageModel):
    def load(self) -> None:
        sd = self.stage_deploy
        self.text_wait_s = float(sd.options.get(TEXT_WAIT_OPTION.name) or TEXT_WAIT_OPTION.default)
        self.text_feeds: dict[str, TextFeed] = {}
        engine = create_engine(resolve_checkpoint(self.model_path), max_num_seqs=sd.max_num_seqs,
                               max_model_len=sd.max_model_len, num_threads=sd.threads, dtype=sd.dtype,
                               device=sd.device, cuda_graph_sizes=sd.cuda_graph_sizes,
                               enforce_eager=sd.enforce_eager, batch_invariant=sd.batch_invariant,
                               max_prefills_per_step=sd.max_prefills_per_step, max_input_wait_s=self.text_wait_s,
                               compile_mode=sd.options.get(COMPILE_OPTION.name) or COMPILE_OPTION.default)
        self.builder = engine.runner.checkpoint.prompt_builder()
        # Deploy-level sampling defaults (every key of default_sampling_params, and the code
        # predictor's subtalker_* from options) override the checkpoint's generation_config.json.
        defaults = engine.default_params
        code_predictor = dataclasses.replace(defaults.extra, **{k: v for k, v in sd.options.items()
                                                                if k in CODE_PREDICTOR_FIELDS and v is not None})
        self.default_params = dataclasses.replace(defaults, extra=code_predictor,
                                                  **sd.default_sampling_params).validate()
        code_predictor_params(self.default_params)   # a bad deploy value fails the load, not each request
        self.engine = AsyncEngine(engine)
        checkpoint = engine.runner.checkpoint
        self.voice_encoder = None
        if checkpoint.config.tts_model_type == "base":
            from omni_backend.models.qwen3_tts.voice_clone import VoiceEncoder

            self.voice_encoder = VoiceEncoder.from_checkpoint(checkpoint.path, dict(checkpoint.config.speaker_encoder),
                                                              device=sd.device)
        # code2wav: in_talker: this stage decodes its own windows and streams AUDIO (talker_decoding.py);
        # adaptive: it streams CODES, and decodes the first window of a request that is alone here
        placement = sd.options.get(CODE2WAV_PLACEMENT_OPTION.name)
        self.windows = (TalkerWindows(self.pipeline, self.deploy, checkpoint.path)
                        if placement in ("in_talker", "adaptive") else None)
        self.decodes_first_window_alone = placement == "adaptive"
        self.voice_cache: OrderedDict = OrderedDict()
        self.voice_cache_size = int(os.environ.get("OMNI_VOICE_CACHE_SIZE", "256"))
        self.voice_lock = threading.Lock()

    def _encoded_voice(self, ref_audio: str, x_vector_only: bool):
        """(x-vector, ref codes or None) of a recording, from the cache or encoded now (in a worker
        thread; one encoding at a time)."""
        from omni_backend.reference_audio import decode_reference_audio

        key = (hashlib.sha256(ref_audio.encode("utf-8", "surrogatepass")).hexdigest(), bool(x_vector_only))
        with self.voice_lock:
            if key in self.voice_cache:
                self.voice_cache.move_to_end(key)
                return self.voice_cache[key]
            audio, rate = decode_reference_audio(ref_audio, "ref_audio")
            value = self.voice_encoder.encode_audio(audio, rate, with_codes=not x_vector_only)
            self.voice_cache[key] = value
            while len(self.voice_cache) > self.voice_cache_size:
                self.voice_cache.popitem(last=False)
            self.metrics.voice_encoded()
            return value

    async def _voice_clone(self, ctx: StreamContext, request: dict[str, Any]):
        from omni_backend.models.qwen3_tts.prompt import VoiceClonePrompt

        if request.get("speaker_embedding") is not None:   # an x-vector computed before
            import torch

            return VoiceClonePrompt(speaker_embedding=torch.tensor(request["speaker_embedding"], dtype=torch.float32),
                                    ref_codes=None, x_vector_only=True, ref_text=None)
        if request.get("ref_audio") is None:
            return None

        if self.voice_encoder is None:
            raise PipelineError("ref_audio given to a checkpoint without a speaker encoder")
        x_vector_only = bool(request.get("x_vector_only_mode"))
        xvector, codes = await self.wait(ctx, self.run_blocking(self._encoded_voice, request["ref_audio"],
                                                                 x_vector_only))
        return VoiceClonePrompt(speaker_embedding=xvector, ref_codes=codes, x_vector_only=x_vector_only,
                                ref_text=request.get("ref_text"))

    def sampling_params(self, request: dict[str, Any]) -> SamplingParams:
        return sampling_params_from_request(self.default_params, request)

    async def generate(self, ctx: StreamContext, request: dict[str, Any],
                       inputs: dict[str, np.ndarray]) -> AsyncIterator[list["pb_utils.Tensor"]]:
        rid = ctx.stage_request_id
        feed = None
        if request.get("streaming_input"):   # before any await: appends may come at once
            feed = self.text_feeds[rid] = TextFeed(StreamedText(self.builder.tokenizer))
            ctx.resources.append(ForgetOnRelease(self.text_feeds, rid))
            feed.push(request["text"], end=False)
        clone = await self._voice_clone(ctx, request)
        if feed is not None:
            try:
                await self.wait(ctx, asyncio.wait_for(feed.first_id.wait(), self.text_wait_s))
            except asyncio.TimeoutError:
                raise InvalidRequest("text", f"no word of the text was complete within {self.text_wait_s:g} s "
                                             "and the input did not end (text_wait_s)") from None
        prompt = self.builder.build(request["text"], speaker=request.get("voice"),
                                    language=request.get("language"), instruct=request.get("instructions"),
                                    non_streaming_mode=request.get("non_streaming_mode"), voice_clone=clone,
                                    streamed_ids=None if feed is None else tuple(feed.streamed.ids))
        context = clone.ref_codes.numpy() if clone is not None and not clone.x_vector_only else None
        cutter = None
        if self.windows is not None:
            # adaptive: the first window is decoded here if, when it is cut, this request is the
            # engine's only one (the engine counts a request until its last event, not at that one);
            # every other window goes to code2wav, on its own core in parallel with the steps
            # (CodecWindows: the spans tell which is which)
            alone = ((lambda event: self.engine.num_requests <= (0 if event.finished else 1))
                     if self.decodes_first_window_alone else None)
            cutter = self.windows.cutter(request, context, alone)
        with recording_named_if_too_long(request):
            stream = self.engine.add_request(rid, prompt, self.sampling_params(request), input_open=feed is not None,
                                             after_event=cutter)
        if feed is not None:
            feed.attach(self.engine, rid, len(feed.streamed.ids))
        ctx.resources.append(stream)
        frames = self._frames(ctx, stream, None if cutter is None else cutter.withheld_before)
        if cutter is not None and cutter.first_window_if is None:   # the engine thread decoded every window
            async for _ in frames:
                for _start, _end, audio in cutter.take():
                    yield [pb_utils.Tensor("AUDIO", audio)]
            return
        async for codes in frames:
            tensors = []
            if codes.size:
                tensors.append(pb_utils.Tensor("CODES", codes))
                if context is not None:
                    tensors.append(pb_utils.Tensor("CONTEXT_CODES", np.ascontiguousarray(context, dtype=np.int64)))
                    context = None
            # windows decoded here go with (or before) the frame that completes them, each with its
            # span, so the entry never sends them to code2wav too
            for start, end, audio in (cutter.take() if cutter is not None else ()):
                yield [*tensors, pb_utils.Tensor("AUDIO", audio),
                       pb_utils.Tensor("AUDIO_SPAN", np.array([start, end], dtype=np.int64))]
                tensors = []
            if tensors:
                yield tensors

    async def _frames(self, ctx: StreamContext, stream,
                      withheld_before: Callable[[int], list[np.ndarray]] | None = None) -> AsyncIterator[np.ndarray]:
        """The request's codec frames as the engine makes them, [frames, 16] per delivered event
        (with `withheld_before`, the frames of the events not delivered before it go with it),
        and, empty, its end."""
        async for event in self.engine_events(ctx, stream):
            if event.finish_reason == "input_timeout":
                raise InvalidRequest("text", f"the talker read all the text that arrived and waited "
                                             f"{self.text_wait_s:g} s for more, which did not come and the "
                                             "input did not end (text_wait_s)")
            frames = [] if withheld_before is None else withheld_before(event.index)
            if event.codes is not None:
                frames.append(event.codes)
            if frames:
                yield np.asarray(frames, dtype=np.int64)
            elif event.finished:
                yield np.zeros(0, dtype=np.int64)

    async def on_append(self, ctx: StreamContext, text: str, end: bool) -> None:
        feed = self.text_feeds.get(ctx.stage_request_id)
        if feed is None:
            raise InvalidRequest("streaming_input", "this stream was not opened with streaming_input: true")
        feed.push(text, end)

    def on_cancel(self, ctx: StreamContext) -> None:
        self.engine.cancel(ctx.stage_request_id)

    def release_resources(self) -> None:
        self.engine.close(timeout=2.0)

