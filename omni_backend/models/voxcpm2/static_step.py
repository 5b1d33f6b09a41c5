"""VoxCPM2's decode step over static buffers: what a CUDA graph captures, side module included.

:class:`StaticStep` runs one step for the batch rows ``0..B-1`` (compact: row ``i`` is the
``i``-th request of the group, its cache slot in ``slots``). Its inputs are buffers the runner
fills on the host before each run, so nothing in :meth:`StaticStep.run` reads a device value on
the host, allocates outside the caching allocator or depends on a Python value that changes
between steps, except the captured variant ``timesteps``:

1. the side module: the diffusion transformer's fixed-step Euler solver with CFG from each row's
   hidden states, previous patch, guidance scale (``cfg``) and noise (``noise``, drawn on the host
   from the request's own generator, as the reference draws it, then copied in: the graph replays
   no random kernel, and the draws stay the reference's);
2. the stop head's decision per row (``stop``: argmax; ``min_len`` is applied by the runner);
3. the feedback of every row's new patch through the local encoder, the backbone and the residual
   LM at ``positions`` of its slot; the next state is written in place into the state buffers.

Rows past the group's size in the bucket are padding: their slot is the scratch slot (one past the
engine's), so their cache writes land where no request reads; a row whose request stops this step
is fed back too (its slot is its own until it is released, and nothing reads what it wrote).
"""
from __future__ import annotations

import torch

from .minicpm import StaticKVCache
from .model import StepState, VoxCPM2

__all__ = ["StaticStep"]


class StaticStep:
    """One decode step of rows ``0..B-1`` over static buffers (see the module docstring)."""

    def __init__(self, model: VoxCPM2, lm_cache: StaticKVCache, res_cache: StaticKVCache, rows: int,
                 scratch_slot: int) -> None:
        self.model = model
        self.lm_cache, self.res_cache = lm_cache, res_cache
        self.rows = rows
        self.scratch_slot = scratch_slot
        p = next(model.parameters())
        device, dtype = p.device, p.dtype
        self.device, self.dtype = device, dtype
        h, ps, d = model.config.lm_config.hidden_size, model.patch_size, model.feat_dim
        self.lm_hidden = torch.zeros(rows, h, dtype=dtype, device=device)
        self.residual_hidden = torch.zeros(rows, h, dtype=dtype, device=device)
        self.prefix_cond = torch.zeros(rows, ps, d, dtype=dtype, device=device)
        self.noise = torch.zeros(rows, d, ps, dtype=dtype, device=device)
        self.cfg = torch.zeros(rows, dtype=torch.float32, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.slots = torch.full((rows,), scratch_slot, dtype=torch.long, device=device)
        # outputs: this step's patch per row (the model's dtype) and the stop head's choice
        self.patches = torch.zeros(rows, ps, d, dtype=dtype, device=device)
        self.stop = torch.zeros(rows, dtype=torch.long, device=device)

    # ------------------------------------------------------------------ host side
    def load(self, state: StepState, noise: torch.Tensor, cfg: torch.Tensor, positions: torch.Tensor,
             slots: torch.Tensor, size: int) -> None:
        """The group's rows ``0..n-1`` (n = ``state``'s rows) and padding rows ``n..size-1``
        (zeros, the scratch slot at position 0: finite, harmless)."""
        n = state.lm_hidden.shape[0]
        self.lm_hidden[:n].copy_(state.lm_hidden)
        self.residual_hidden[:n].copy_(state.residual_hidden)
        self.prefix_cond[:n].copy_(state.prefix_cond)
        self.noise[:n].copy_(noise)
        self.cfg[:n].copy_(cfg)
        self.positions[:n].copy_(positions)
        self.slots[:n].copy_(slots)
        if size > n:
            self.pad(n, size)

    def pad(self, start: int, size: int) -> None:
        for buffer in (self.lm_hidden, self.residual_hidden, self.prefix_cond, self.noise, self.cfg, self.positions):
            buffer[start:size].zero_()
        self.slots[start:size].fill_(self.scratch_slot)

    # ------------------------------------------------------------------ the captured step
    def run(self, batch: int, timesteps: int) -> None:
        """One step of rows ``0..batch-1``: ``patches`` and ``stop`` for each, and the state buffers
        advanced past the new patch."""
        m = self.model
        state = StepState(self.lm_hidden[:batch], self.residual_hidden[:batch], self.prefix_cond[:batch])
        patch = m.side_module(state, self.noise[:batch], timesteps, self.cfg[:batch])
        self.stop[:batch].copy_(m.stop_logits(state.lm_hidden).argmax(dim=-1))
        self.patches[:batch].copy_(patch)
        # the solver's [B, D, P] layout viewed as [B, P, D], as the eager step feeds it back
        nxt = m.advance(patch, self.positions[:batch], self.slots[:batch], self.lm_cache, self.res_cache)
        self.lm_hidden[:batch].copy_(nxt.lm_hidden)
        self.residual_hidden[:batch].copy_(nxt.residual_hidden)
        self.prefix_cond[:batch].copy_(patch)
