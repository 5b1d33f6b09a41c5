"""Orpheus's Llama on the torch AR engine (``engine: torch``; ``engine: vllm`` runs vLLM instead).

A frame is one token. Each sequence runs in the reference's shapes, one at a time (prompt as one
forward, then one token per forward over its cached keys), so a served greedy sequence equals
transformers' ``generate`` and never depends on what it is batched with. The repetition penalty
covers prompt and generated ids, as in transformers and vLLM.
"""
from __future__ import annotations

from typing import Any

import torch

from omni_backend.engine import AREngine, ModelRunner, SamplingParams, Sequence, StaticKVCache, StepOutput
from omni_backend.engine.sampling import TokenRules, select

from .llama import LlamaForCausalLM, load_llama

__all__ = ["OrpheusRunner", "create_engine"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class _State:
    __slots__ = ("ids", "last")

    def __init__(self, prompt: list[int]) -> None:
        self.ids = list(prompt)     # prompt + generated, for the repetition penalty
        self.last = 0


class OrpheusRunner(ModelRunner):
    def __init__(self, model: LlamaForCausalLM, eos_token_ids: frozenset[int], max_num_seqs: int,
                 max_model_len: int) -> None:
        c = model.config
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.max_model_len = min(max_model_len, c.max_position_embeddings)
        self.eos_token_ids = frozenset(eos_token_ids)
        device = model.lm_head.weight.device
        self.cache = StaticKVCache(c.num_hidden_layers, max_num_seqs, c.num_key_value_heads, self.max_model_len,
                                   c.head_dim, dtype=model.lm_head.weight.dtype, device=device)
        self.rules = TokenRules(c.vocab_size, eos_ids=sorted(self.eos_token_ids), device=device)
        self.device = device

    def check(self, prompt: Any, params: SamplingParams) -> None:
        if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
            raise ValueError("the prompt must be a non-empty list of token ids")
        if max(prompt) >= self.model.config.vocab_size or min(prompt) < 0:
            raise ValueError("the prompt holds ids outside the vocabulary")

    def prompt_length(self, prompt: list[int]) -> int:
        return len(prompt)

    def _pick(self, seq: Sequence, logits: torch.Tensor) -> int:
        p = seq.params
        scores = self.rules.apply(logits, seq.state.ids, p.repetition_penalty, seq.ban_eos)
        return select(scores, p.do_sample, p.temperature, p.top_k, p.top_p, seq.generator)

    def prefill(self, seq: Sequence) -> int:
        seq.state = _State(seq.prompt)
        ids = torch.tensor(seq.prompt, dtype=torch.long, device=self.device)
        token = self._pick(seq, self.model.forward_one(ids, self.cache, seq.slot, 0))
        seq.state.last = token
        seq.state.ids.append(token)
        return token

    def decode(self, seqs: list[Sequence]) -> list[StepOutput]:
        out = []
        for seq in seqs:
            frame = [seq.state.last]
            token = None
            if seq.sample_next:
                ids = torch.tensor([seq.state.last], dtype=torch.long, device=self.device)
                logits = self.model.forward_one(ids, self.cache, seq.slot, seq.prompt_len + seq.num_frames)
                token = self._pick(seq, logits)
                seq.state.last = token
                seq.state.ids.append(token)
            out.append(StepOutput(seq, frame, token))
        return out


def create_engine(path: str, eos_token_ids: frozenset[int], *, max_num_seqs: int, max_model_len: int,
                  dtype: str = "float32", device: str = "cpu", num_threads: int | None = None,
                  default_params: SamplingParams | None = None) -> AREngine:
    model = load_llama(path, dtype=_DTYPES[dtype], device=device)
    runner = OrpheusRunner(model, eos_token_ids, max_num_seqs, max_model_len)
    return AREngine(runner, max_num_seqs=max_num_seqs, max_prefills_per_step=max_num_seqs, num_threads=num_threads,
                    default_params=default_params)
