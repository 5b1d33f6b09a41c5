"""Qwen3-Omni's thinker on the AR engine: a plain causal LM, a frame is one token.

Each sequence runs in the reference's shapes, one at a time (the prompt as one forward, then one
token per forward over its own cache), so a served greedy answer equals the reference's
``generate`` bit for bit and never depends on what it is batched with: the MoE routing groups
tokens by expert, so a batched forward would change the matmul shapes of every expert. Tokens
are chosen by :class:`~.generate.Sampling`, the reference's processor order, with the repetition
penalty over prompt and answer ids (transformers' rule).

The engine's stop rules apply as for any LM (eos is not a frame; ``max_new_tokens`` frames at
most); the stage turns each frame into the token the talker reads and a text delta.

A prompt with media (a :class:`~.prompt.ThinkerPrompt` holding audio features) is encoded in the
prefill, on the engine's thread: the audio tower runs over the request's recordings and its output
replaces the placeholder embeddings. When the prompt asks for it (``hidden_layer``), the prefill
keeps the thinker's hidden state of that layer at the placeholders (``media_hidden``): what the
talker reads there.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from omni_backend.engine import ModelRunner, SamplingParams, Sequence, StepOutput

from .audio_tower import AudioTower
from .config import Qwen3OmniConfig
from .generate import Sampling
from .layers import KVCache, text_positions
from .prompt import ThinkerPrompt
from .prompt_embeds import prompt_embeds
from .thinker import Thinker
from .vision_encoder import VisionEncoder

__all__ = ["ThinkerRunner", "PREFILL_LOGITS_ROWS"]

# The prefill's LM head runs over the last rows only (a long prompt's [L, vocab] logits are large);
# 4 is a common matmul shape, so the last row's bits are those of the reference's all-rows head.
PREFILL_LOGITS_ROWS = 4


@dataclass
class _State:
    cache: KVCache
    ids: torch.Tensor      # [1, prompt + answer] on the CPU: what the repetition penalty covers
    sampling: Sampling
    delta: int = 0         # decode positions: cache length + delta (images move them)


class ThinkerRunner(ModelRunner):
    def __init__(self, thinker: Thinker, eos_token_ids: frozenset[int], max_num_seqs: int, max_model_len: int,
                 config: Qwen3OmniConfig | None = None, audio_tower: AudioTower | None = None,
                 visual: VisionEncoder | None = None) -> None:
        self.thinker = thinker
        self.config = config
        self.audio_tower = audio_tower
        self.visual = visual
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.vocab_size = thinker.config.vocab_size
        self.device = thinker.lm_head.weight.device

    def check(self, prompt: Any, params: SamplingParams) -> None:
        ids = prompt.ids if isinstance(prompt, ThinkerPrompt) else prompt
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            raise ValueError("the prompt must be a non-empty list of token ids")
        if max(ids) >= self.vocab_size or min(ids) < 0:
            raise ValueError("the prompt holds ids outside the vocabulary")
        if isinstance(prompt, ThinkerPrompt) and prompt.audio_features and (self.audio_tower is None or self.config is None):
            raise ValueError("the prompt holds audio but this thinker has no audio tower loaded")
        if isinstance(prompt, ThinkerPrompt) and prompt.images and (self.visual is None or self.config is None):
            raise ValueError("the prompt holds images but this thinker has no vision encoder loaded")

    def prompt_length(self, prompt: list[int] | ThinkerPrompt) -> int:
        return len(prompt)

    def _choose(self, seq: Sequence, logits: torch.Tensor) -> int:
        st: _State = seq.state
        sampling = st.sampling
        if seq.ban_eos:   # min_new_tokens
            sampling = Sampling(sampling.do_sample, sampling.temperature, sampling.top_k, sampling.top_p,
                                sampling.repetition_penalty, tuple(sorted(self.eos_token_ids)))
        # chosen on the CPU, where the request's generator lives (bit-identical on a CPU model)
        token = sampling.choose(logits[:, -1].to(torch.float32).cpu(), st.ids, seq.generator)
        st.ids = torch.cat((st.ids, token.view(1, 1)), dim=1)
        return int(token)

    def prefill(self, seq: Sequence) -> int:
        p = seq.params
        prompt = seq.prompt if isinstance(seq.prompt, ThinkerPrompt) else ThinkerPrompt(list(seq.prompt))
        ids = torch.tensor([prompt.ids], dtype=torch.long)
        seq.state = _State(self.thinker.new_cache(), ids,
                           Sampling(p.do_sample, p.temperature, p.top_k, p.top_p, p.repetition_penalty))
        media = prompt_embeds(self.thinker, self.audio_tower, self.config, prompt, self.visual) \
            if prompt.multimodal else None
        layer = prompt.hidden_layer if prompt.multimodal else None
        rows = min(len(prompt), PREFILL_LOGITS_ROWS)
        if media is None:
            out = self.thinker(ids.to(self.device), seq.state.cache, accept_layer=layer, logits_rows=rows)
        else:
            seq.state.delta = media.delta
            out = self.thinker(ids.to(self.device), seq.state.cache, media.positions, accept_layer=layer,
                               logits_rows=rows, inputs_embeds=media.embeds, deepstack=media.deepstack,
                               visual_mask=media.visual_mask)
        if layer is not None:
            mask = torch.tensor([t in self.config.multimodal_token_ids for t in prompt.ids], device=self.device)
            prompt.media_hidden = out.accept_hidden[0, mask].to(torch.float32).cpu()
        return self._choose(seq, out.logits)

    def decode(self, seqs: list[Sequence]) -> list[StepOutput]:
        outputs = []
        for seq in seqs:
            st: _State = seq.state
            last = int(st.ids[0, -1])
            token: Optional[int] = None
            if seq.sample_next:
                position = text_positions(st.cache.length + st.delta, 1, self.device)
                out = self.thinker(st.ids[:, -1:].to(self.device), st.cache, position)
                token = self._choose(seq, out.logits)
            outputs.append(StepOutput(seq, [last], token))
        return outputs
