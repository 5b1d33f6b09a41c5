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

``static_step`` (default: on CUDA) runs each group as :class:`~.static_step.StaticStep` over
static buffers, captured as CUDA graphs per batch-size bucket (``cuda_graph_sizes``) and solver
step count (``graph_timesteps``; another count runs the same step eagerly) unless
``enforce_eager``. The host still draws each row's noise from its request's generator (the
reference's draws) and copies it into the step's buffer before the replay.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

import torch

from omni_backend.engine import AREngine, ModelRunner, SamplingParams, Sequence, StepOutput
from omni_backend.engine.sequence import SamplingParamsError

from .local_dit import draw_noise
from .minicpm import StaticKVCache
from .model import StepState, VoxCPM2
from .prompt import Prompt
from .static_step import StaticStep

logger = logging.getLogger(__name__)

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

    def __init__(self, model: VoxCPM2, max_num_seqs: int, max_model_len: int, batch_invariant: bool,
                 static_step: bool | None = None, cuda_graph_sizes: Seq[int] = (1, 2, 4, 8, 16),
                 graph_timesteps: Seq[int] = (10,), enforce_eager: bool = False) -> None:
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.batch_invariant = batch_invariant
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        c = model.config
        use_static = static_step if static_step is not None else self.device.type == "cuda"
        # the static step's padding rows write into one scratch slot past the engine's
        slots = max_num_seqs + 1 if use_static else max_num_seqs
        self.lm_cache = StaticKVCache(c.lm_config, slots, max_model_len, self.device, self.dtype)
        self.res_cache = StaticKVCache(c.residual_lm(), slots, max_model_len, self.device, self.dtype)
        self.static: StaticStep | None = None
        self.graphs = None
        if use_static:
            self._init_static(cuda_graph_sizes, graph_timesteps,
                              enabled=self.device.type == "cuda" and not enforce_eager)

    def _init_static(self, sizes: Seq[int], timesteps: Seq[int], enabled: bool) -> None:
        from omni_backend.engine.cuda_graphs import GraphBuckets

        self.static = StaticStep(self.model, self.lm_cache, self.res_cache, self.max_num_seqs,
                                 scratch_slot=self.max_num_seqs)
        self.graphs = GraphBuckets(self.static.run, sizes, self.max_num_seqs,
                                   variants=[(int(t),) for t in dict.fromkeys(timesteps)],
                                   enabled=enabled, device=self.device)
        with torch.inference_mode():
            try:
                self.graphs.capture(prepare=lambda size: self.static.pad(0, size))
            except Exception:  # serve eagerly rather than not at all
                logger.exception("CUDA graph capture failed; the static step runs eagerly")
                self.graphs.graphs.clear()
                self.graphs.enabled = False

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

    def _inputs(self, seqs: list[Sequence]) -> tuple[StepState, torch.Tensor, torch.Tensor]:
        """The rows' states, this step's noise (one draw per row from its request's generator) and
        guidance scales."""
        m, dev = self.model, self.device
        state = StepState(torch.cat([s.state.lm_hidden for s in seqs]),
                          torch.cat([s.state.residual_hidden for s in seqs]),
                          torch.cat([s.state.prefix_cond for s in seqs]))
        noise = torch.stack([draw_noise(s.generator, m.feat_dim, m.patch_size, self.dtype) for s in seqs]).to(dev)
        cfg = torch.tensor([self._extra(s).cfg_value for s in seqs], device=dev)
        return state, noise, cfg

    def _outputs(self, seqs: list[Sequence], frames: torch.Tensor, stops: list[int]) -> tuple[list[StepOutput], list[int]]:
        """Each row's frame and stop token (the stop head counts only after ``min_len`` patches);
        the indices of the rows that go on."""
        out, going = [], []
        for i, seq in enumerate(seqs):
            stop = stops[i] == STOP and seq.num_frames > self._extra(seq).min_len
            token = None
            if seq.sample_next:
                token = STOP if stop else 0
                if not stop:
                    going.append(i)
            out.append(StepOutput(seq, frames[i].reshape(-1).tolist(), token))
        return out, going

    def _static_rows(self, seqs: list[Sequence]) -> list[StepOutput]:
        """One step of ``seqs`` together on the static step (graph replay where captured)."""
        static, dev = self.static, self.device
        state, noise, cfg = self._inputs(seqs)
        size = self.graphs.bucket(len(seqs))
        static.load(state, noise, cfg, torch.tensor([s.prompt_len + s.num_frames for s in seqs], device=dev),
                    torch.tensor([s.slot for s in seqs], device=dev), size)
        self.graphs.run(len(seqs), self._extra(seqs[0]).inference_timesteps)
        n = len(seqs)
        frames = static.patches[:n].float().cpu()
        out, going = self._outputs(seqs, frames, static.stop[:n].tolist())
        for i in going:
            seqs[i].state = StepState(static.lm_hidden[i:i + 1].clone(), static.residual_hidden[i:i + 1].clone(),
                                      static.prefix_cond[i:i + 1].clone())
        return out

    def _rows(self, seqs: list[Sequence]) -> list[StepOutput]:
        """One step of ``seqs`` together (the same ``inference_timesteps``)."""
        if self.static is not None:
            return self._static_rows(seqs)
        m, dev = self.model, self.device
        state, noise, cfg = self._inputs(seqs)
        patches = m.side_module(state, noise, self._extra(seqs[0]).inference_timesteps, cfg)
        stops = m.stop_logits(state.lm_hidden).argmax(dim=-1).tolist()
        frames = patches.float().cpu()
        out, going = self._outputs(seqs, frames, stops)
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
                  num_threads: int | None = None, default_params: SamplingParams | None = None,
                  static_step: bool | None = None, cuda_graph_sizes: Seq[int] | None = None,
                  graph_timesteps: Seq[int] = (10,), enforce_eager: bool = False) -> AREngine:
    """The AR engine over a :class:`VoxCPM2Runner`; on CUDA its step is the static step, captured
    as CUDA graphs per ``cuda_graph_sizes`` bucket and ``graph_timesteps`` unless ``enforce_eager``."""
    runner = VoxCPM2Runner(model, max_num_seqs, max_model_len, batch_invariant, static_step=static_step,
                           cuda_graph_sizes=tuple(cuda_graph_sizes) if cuda_graph_sizes else (1, 2, 4, 8, 16),
                           graph_timesteps=graph_timesteps, enforce_eager=enforce_eager)
    return AREngine(runner, max_num_seqs=max_num_seqs, max_prefills_per_step=max_num_seqs, num_threads=num_threads,
                    default_params=default_params)
