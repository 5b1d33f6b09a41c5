"""VoxCPM2's language model on the shared AR engine: the runner's step runs the side module.

The engine stays model-agnostic: it sees a prefill that returns a token and decode steps that
return a frame and the next token. Here a frame is one latent patch (``P * D`` floats) and the
token is the stop decision (1 = stop, the runner's only eos id): in each decode step, for every
row, the diffusion transformer makes the patch from the row's hidden states and its own noise (a
draw from the request's generator, seeded by ``seed``), the stop head reads the backbone's state
(stopping only after ``min_len`` steps, as the reference), and rows that go on feed their patch
back through the local encoder, the backbone and the residual LM (:meth:`VoxCPM2.advance`).

Batching: rows with the same ``inference_timesteps`` run the solver together (a fixed number of
steps per call: graph-safe), then feed their patches back together. With ``batch_invariant`` (the
default on CPU) each row runs alone, so a request's latents never depend on what it is batched
with; otherwise rows share GEMMs and agree with their solo runs within float32 rounding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from omni_backend.engine import AREngine, ModelRunner, SamplingParams, Sequence, StepOutput
from omni_backend.engine.sequence import SamplingParamsError

from .local_dit import draw_noise
from .minicpm import StaticKVCache
from .model import StepState, VoxCPM2
from .prompt import Prompt

__all__ = ["VoxCPM2Params", "VoxCPM2Runner", "create_engine", "STOP"]

STOP = 1


@dataclass(frozen=True)
class VoxCPM2Params:
    """The family's per-request knobs (``SamplingParams.extra``)."""
    cfg_value: float = 2.0
    inference_timesteps: int = 10
    min_len: int = 2

    def check(self) -> None:
        if not (0.0 <= self.cfg_value <= 10.0):
            raise SamplingParamsError("cfg_value", f"must be in [0, 10], got {self.cfg_value!r}")
        if not isinstance(self.inference_timesteps, int) or not 1 <= self.inference_timesteps <= 100:
            raise SamplingParamsError("inference_timesteps", f"must be an integer in [1, 100], "
                                                             f"got {self.inference_timesteps!r}")
        if not isinstance(self.min_len, int) or self.min_len < 0:
            raise SamplingParamsError("min_len", f"must be an integer >= 0, got {self.min_len!r}")


class VoxCPM2Runner(ModelRunner):
    eos_token_ids = frozenset({STOP})

    def __init__(self, model: VoxCPM2, max_num_seqs: int, max_model_len: int, batch_invariant: bool) -> None:
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.batch_invariant = batch_invariant
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        c = model.config
        self.lm_cache = StaticKVCache(c.lm_config, max_num_seqs, max_model_len, self.device, self.dtype)
        self.res_cache = StaticKVCache(c.residual_lm(), max_num_seqs, max_model_len, self.device, self.dtype)

    def check(self, prompt: Any, params: SamplingParams) -> None:
        if not isinstance(prompt, Prompt):
            raise ValueError("the prompt must be a voxcpm2 Prompt")
        extra = params.extra if params.extra is not None else VoxCPM2Params()
        if not isinstance(extra, VoxCPM2Params):
            raise ValueError("SamplingParams.extra must be VoxCPM2Params")
        extra.check()

    def prompt_length(self, prompt: Prompt) -> int:
        return len(prompt)

    def prefill(self, seq: Sequence) -> int:
        p: Prompt = seq.prompt
        dev = self.device
        state, lm_kv, res_kv = self.model.prefill(p.text_token[None].to(dev), p.text_mask[None].to(dev),
                                                  p.feat[None].to(dev, self.dtype), p.feat_mask[None].to(dev))
        self.lm_cache.fill(seq.slot, lm_kv)
        self.res_cache.fill(seq.slot, res_kv)
        seq.state = state
        return 0     # not a stop: the first patch always comes

    @staticmethod
    def _extra(seq: Sequence) -> VoxCPM2Params:
        return seq.params.extra if seq.params.extra is not None else VoxCPM2Params()

    def _rows(self, seqs: list[Sequence]) -> list[StepOutput]:
        """One step of ``seqs`` together (the same ``inference_timesteps``)."""
        m, dev = self.model, self.device
        state = StepState(torch.cat([s.state.lm_hidden for s in seqs]),
                          torch.cat([s.state.residual_hidden for s in seqs]),
                          torch.cat([s.state.prefix_cond for s in seqs]))
        noise = torch.stack([draw_noise(s.generator, m.feat_dim, m.patch_size, self.dtype) for s in seqs]).to(dev)
        cfg = torch.tensor([self._extra(s).cfg_value for s in seqs], device=dev)
        patches = m.side_module(state, noise, self._extra(seqs[0]).inference_timesteps, cfg)
        stops = m.stop_logits(state.lm_hidden).argmax(dim=-1).tolist()
        frames = patches.float().cpu()
        out, going = [], []
        for i, seq in enumerate(seqs):
            stop = stops[i] == STOP and seq.num_frames > self._extra(seq).min_len
            token = None
            if seq.sample_next:
                token = STOP if stop else 0
                if not stop:
                    going.append(i)
            out.append(StepOutput(seq, frames[i].reshape(-1).tolist(), token))
        if going:
            idx = torch.tensor(going, device=dev)
            rows = [seqs[i] for i in going]
            # selected in the solver's [B, D, P] layout and viewed as [B, P, D], as the reference's
            # patch: the local encoder's GEMM on a transposed view rounds differently from a copy
            nxt = m.advance(patches.transpose(1, 2).index_select(0, idx).transpose(1, 2),
                            torch.tensor([s.prompt_len + s.num_frames for s in rows], device=dev),
                            torch.tensor([s.slot for s in rows], device=dev), self.lm_cache, self.res_cache)
            for j, s in enumerate(rows):
                s.state = StepState(nxt.lm_hidden[j:j + 1], nxt.residual_hidden[j:j + 1], nxt.prefix_cond[j:j + 1])
        return out

    def decode(self, seqs: list[Sequence]) -> list[StepOutput]:
        if self.batch_invariant:
            groups = [[s] for s in seqs]
        else:
            by_steps: dict[int, list[Sequence]] = {}
            for s in seqs:
                by_steps.setdefault(self._extra(s).inference_timesteps, []).append(s)
            groups = list(by_steps.values())
        done = {}
        for group in groups:
            for o in self._rows(group):
                done[id(o.seq)] = o
        return [done[id(s)] for s in seqs]


def create_engine(model: VoxCPM2, *, max_num_seqs: int, max_model_len: int, batch_invariant: bool,
                  num_threads: int | None = None, default_params: SamplingParams | None = None) -> AREngine:
    runner = VoxCPM2Runner(model, max_num_seqs, max_model_len, batch_invariant)
    return AREngine(runner, max_num_seqs=max_num_seqs, max_prefills_per_step=max_num_seqs, num_threads=num_threads,
                    default_params=default_params)
