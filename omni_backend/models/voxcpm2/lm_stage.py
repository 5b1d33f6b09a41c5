"""Stage ``lm`` of VoxCPM2: the language model with its side module on the shared AR engine
(:mod:`.runner`), streaming latent patches.

Each response carries the patches made since the last one as LATENTS [frames, D] (``P`` latent
frames per patch), with CONTEXT [1] (latent frames at its start that are the cloning recording's
context, only in the first response) and PATCH_SIZE [1]. A cloning recording (``ref_audio``) is
encoded once per padding side (continuation pads on the left, a reference on the right) and cached
by the sha256 of its payload (``omni_voice_encodings_total`` counts the encodings).
"""
from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from typing import Any, AsyncIterator

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from omni_backend.engine import AsyncEngine, SamplingParams
from omni_backend.reference_audio import recording_named_if_too_long
from omni_backend.triton.decoupled import StreamContext
from omni_backend.triton.stage import StageModel

from .builtin import resolve_checkpoint
from .prompt import build_prompt, controlled_text, max_patches
from .adapter import DEFAULTS, clone_mode
from .runner import VoxCPM2Params

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class VoxCPM2LMStage(StageModel):
    def load(self) -> None:
        from .model import load_model
        from .runner import create_engine
        from .tokenizer import TextTokenizer

        sd = self.stage_deploy
        torch.set_num_threads(sd.threads)
        path = resolve_checkpoint(self.model_path)
        self.model, self.vae = load_model(path, device=sd.device, dtype=_DTYPES[sd.dtype])
        self.tokenize = TextTokenizer(path)
        self.engine = AsyncEngine(create_engine(self.model, max_num_seqs=sd.max_num_seqs,
                                                max_model_len=sd.max_model_len,
                                                batch_invariant=bool(sd.batch_invariant), num_threads=sd.threads,
                                                cuda_graph_sizes=sd.cuda_graph_sizes, enforce_eager=sd.enforce_eager,
                                                # graphs for the default solver; other counts run the same step eagerly
                                                graph_timesteps=(int(DEFAULTS["inference_timesteps"]),)))
        self.recordings: OrderedDict = OrderedDict()
        self.recordings_size = int(os.environ.get("OMNI_VOICE_CACHE_SIZE", "256"))
        self.recordings_lock = threading.Lock()

    def _recording(self, ref_audio: str, pad: str) -> torch.Tensor:
        from .recording import recording_patches

        # padded on another side, the same recording encodes to other patches
        key = (hashlib.sha256(ref_audio.encode("utf-8", "surrogatepass")).hexdigest(), pad)
        with self.recordings_lock:
            if key in self.recordings:
                self.recordings.move_to_end(key)
                return self.recordings[key]
            patches = recording_patches(self.vae, ref_audio, self.model.patch_size, pad=pad)
            self.recordings[key] = patches
            while len(self.recordings) > self.recordings_size:
                self.recordings.popitem(last=False)
            self.metrics.voice_encoded()
            return patches

    async def generate(self, ctx: StreamContext, request: dict[str, Any],
                       inputs: dict[str, np.ndarray]) -> AsyncIterator[list["pb_utils.Tensor"]]:
        m = self.model
        prompt_feat = ref_feat = None
        mode = clone_mode(request)
        if mode in ("reference", "ref_continuation"):
            ref_feat = await self.wait(ctx, self.run_blocking(self._recording, request["ref_audio"], "right"))
        if mode in ("continuation", "ref_continuation"):
            prompt_feat = await self.wait(ctx, self.run_blocking(self._recording, request["ref_audio"], "left"))
        text = controlled_text(request["text"], request.get("instructions"))
        prompt = build_prompt(self.tokenize, text, m.patch_size, m.feat_dim, request.get("ref_text") or "",
                              prompt_feat, ref_feat)
        given = {k: request[k] for k in DEFAULTS if request.get(k) is not None}
        r = {**DEFAULTS, **given}
        limit = max_patches(prompt, int(r["max_len"]))
        # ignore_eos: the stop head may end nothing before the limit
        min_len = limit if request.get("ignore_eos") else int(r["min_len"])
        extra = VoxCPM2Params(cfg_value=float(r["cfg_value"]), inference_timesteps=int(r["inference_timesteps"]),
                              min_len=min_len)
        params = SamplingParams(max_new_tokens=limit, min_new_tokens=0,
                                seed=int(r["seed"]), extra=extra)
        with recording_named_if_too_long(request):
            stream = self.engine.add_request(ctx.stage_request_id, prompt, params)
        ctx.resources.append(stream)
        context = [p.numpy() for p in prompt.context_patches]
        patch = np.asarray([m.patch_size], dtype=np.int32)
        first = True
        iterator = stream.__aiter__()
        while True:
            try:
                event = await self.wait(ctx, iterator.__anext__())
            except StopAsyncIteration:
                return
            events = (event, *stream.drain())
            rows = []
            finished = False
            for ev in events:
                if ev.finish_reason == "error":
                    from omni_backend.errors import PipelineError

                    raise PipelineError(f"engine: {ev.error}")
                if ev.codes is not None:
                    rows.append(np.asarray(ev.codes, dtype=np.float32).reshape(m.patch_size, m.feat_dim))
                finished = finished or ev.finished
            if first:
                rows = context + rows
            if rows:
                latents = np.concatenate(rows).astype(np.float32)
                ctx_frames = len(context) * m.patch_size if first else 0
                yield [pb_utils.Tensor("LATENTS", latents),
                       pb_utils.Tensor("CONTEXT", np.asarray([ctx_frames], dtype=np.int32)),
                       pb_utils.Tensor("PATCH_SIZE", patch)]
                first = False
            if finished:
                return

    def on_cancel(self, ctx: StreamContext) -> None:
        self.engine.cancel(ctx.stage_request_id)

    def release_resources(self) -> None:
        self.engine.close(timeout=2.0)
