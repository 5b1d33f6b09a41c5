"""The throughput mode's decode steps over static buffers, what a CUDA graph captures.

Row ``b`` of a step is cache slot ``b`` (the scheduler hands out the lowest free slots); rows of
the bucket that no request uses this step are padding: their inputs are whatever the buffers
hold, their outputs are not read, and their one cache write lands at their own row's position,
which that row's next real step overwrites (or a new request's prefill does). Nothing in
``run`` reads a device value on the host or takes a shape from one, so each (batch bucket,
attention length bucket) is captured once and replayed; the host fills the inputs before a
replay and reads the outputs after it.

* :class:`ThinkerDecodeStep`: one token per row -> the next-token logits ``[rows, vocab]``
  (float32); the host chooses each token with the request's processors and generator.
* :class:`TalkerFrameStep`: the talker's whole frame step: the code predictor completes each
  row's frame (its 2-token prefill and 14 steps, each code chosen inside the step: greedy argmax,
  or, in the ``sample`` variant, temperature / top-k / top-p and a draw by the exponential race
  ``argmax(p / E)`` whose noise ``E = -log U`` is a counter-based hash of the request's seed and
  frame counter (:func:`~omni_backend.engine.counter_rng.uniform`): reproducible per request,
  whatever its batch, with no host work), then the next talker input (the frame's 16 codebook
  embeddings summed + the row's text row) runs one talker position -> codebook-0 logits
  ``[rows, vocab]`` and the talker's normed hidden state (the next frame's code predictor input).

The MoE block (:class:`~.moe.SparseMoeBlock`) is graph-safe as it is: routing by ``topk``,
(token, expert) pairs sorted on the device, rows per expert counted by ``histc`` over the fixed
expert range, and ``grouped_mm`` reading those offsets on the device: static shapes
(``rows * top_k`` pairs), no host read. ``tests/unit/test_qwen3_omni_graph_step.py`` runs both
steps on the meta device at the released 30B-A3B shape (a host read raises there) and checks
that they equal the eager throughput path on CPU.
"""
from __future__ import annotations

import math

import torch

from omni_backend.engine.counter_rng import uniform
from omni_backend.engine.kv_cache import StaticKVCache

from .batched_decode import decode_rows
from .layers import rms_norm
from .talker import Talker
from .thinker import Thinker

__all__ = ["ThinkerDecodeStep", "TalkerFrameStep", "attention_length"]


def attention_length(buckets: list[int], furthest: int) -> int:
    """The smallest length bucket that holds cache positions ``0..furthest``."""
    for length in buckets:
        if furthest < length:
            return length
    raise ValueError(f"position {furthest} is beyond the longest bucket {buckets[-1]}")


def _positions3(positions: torch.Tensor) -> torch.Tensor:
    """Text positions ``[3, B, 1]`` (the three M-RoPE components equal)."""
    return positions.view(1, -1, 1).expand(3, -1, -1)


class ThinkerDecodeStep:
    def __init__(self, thinker: Thinker, cache: StaticKVCache, rows: int) -> None:
        self.thinker, self.cache, self.rows = thinker, cache, rows
        device = thinker.lm_head.weight.device
        self.ids = torch.zeros(rows, dtype=torch.long, device=device)         # each row's last token
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)   # its cache position
        # its rotary offset: a prompt with images decodes at cache position + delta
        self.deltas = torch.zeros(rows, dtype=torch.long, device=device)
        self.slots = torch.arange(rows, device=device)
        self.logits = torch.zeros(rows, thinker.config.vocab_size, dtype=torch.float32, device=device)

    def run(self, batch: int, length: int) -> None:
        """Rows ``0..batch-1``: ``logits[:batch]`` of the token after ``ids``; every position is
        below ``length``."""
        thinker = self.thinker
        positions = self.positions[:batch]
        hidden = thinker.embed(self.ids[:batch].view(-1, 1))
        cos, sin = thinker.rotary(_positions3(positions + self.deltas[:batch]), hidden.dtype)
        hidden = decode_rows(thinker.model.layers, hidden, cos, sin, self.cache, self.slots[:batch], positions, length)
        norm = thinker.model.norm
        logits = thinker.lm_head(rms_norm(hidden, norm.weight, norm.variance_epsilon))
        self.logits[:batch].copy_(logits[:, -1])


class TalkerFrameStep:
    def __init__(self, talker: Talker, cache: StaticKVCache, rows: int) -> None:
        self.talker, self.cache, self.rows = talker, cache, rows
        device = talker.codec_head.weight.device
        dtype = talker.codec_head.weight.dtype
        hidden_size = talker.config.text.hidden_size
        groups = talker.code_predictor.num_steps + 1
        self.pending = torch.zeros(rows, dtype=torch.long, device=device)     # codebook 0 of the frame
        self.hidden = torch.zeros(rows, 1, hidden_size, dtype=dtype, device=device)   # talker state before it
        self.text = torch.zeros(rows, 1, hidden_size, dtype=dtype, device=device)     # the row's text row
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.deltas = torch.zeros(rows, dtype=torch.long, device=device)   # rotary offset (images)
        self.slots = torch.arange(rows, device=device)
        self.codes = torch.zeros(rows, groups, dtype=torch.long, device=device)      # the frame
        self.logits = torch.zeros(rows, talker.config.text.vocab_size, dtype=torch.float32, device=device)
        self.next_hidden = torch.zeros(rows, 1, hidden_size, dtype=dtype, device=device)
        # the code predictor's sampling per row, and its noise's seed and draw counter (the frame index)
        self.do_sample = torch.zeros(rows, dtype=torch.bool, device=device)
        self.temperature = torch.ones(rows, dtype=torch.float32, device=device)
        self.top_k = torch.zeros(rows, dtype=torch.long, device=device)
        self.top_p = torch.ones(rows, dtype=torch.float32, device=device)
        self.seed = torch.zeros(rows, dtype=torch.long, device=device)
        self.counter = torch.zeros(rows, dtype=torch.long, device=device)
        vocab = talker.code_predictor.config.vocab_size
        self.noise_index = torch.arange(talker.code_predictor.num_steps * vocab, device=device)

    def _select(self, batch: int, scores: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        """Each row's code: argmax, or its warped distribution drawn with ``noise`` ``[B, vocab]``."""
        greedy = torch.argmax(scores, dim=-1)
        if noise is None:
            return greedy
        vocab = scores.shape[-1]
        s = scores / self.temperature[:batch].view(-1, 1)
        k = self.top_k[:batch]
        k = torch.where((k > 0) & (k < vocab), k, torch.full_like(k, vocab))
        kth = torch.sort(s, dim=-1, descending=True).values.gather(1, (k - 1).view(-1, 1))
        s = s.masked_fill(s < kth, -math.inf)
        ascending, order = torch.sort(s, dim=-1, descending=False)
        remove = ascending.softmax(dim=-1).cumsum(dim=-1) <= (1 - self.top_p[:batch]).view(-1, 1)
        remove[:, -1] = False
        s = s.masked_fill(remove.scatter(1, order, remove), -math.inf)
        sampled = torch.argmax(s.softmax(dim=-1) / noise, dim=-1)
        return torch.where(self.do_sample[:batch], sampled, greedy)

    def run(self, batch: int, length: int, sample: bool = False) -> None:
        """Rows ``0..batch-1``: ``codes[:batch]`` the frame of ``pending``, ``logits[:batch]`` its
        next codebook 0, ``next_hidden[:batch]`` the talker state that predicts it. ``sample``:
        the rows with ``do_sample`` draw their codes (else every row is greedy)."""
        talker = self.talker
        pending = self.pending[:batch]
        noise = None
        if sample:
            u = uniform(self.seed[:batch], self.counter[:batch], self.noise_index)
            noise = (-torch.log(u)).view(batch, talker.code_predictor.num_steps, -1)
        residual, frame_embeds = talker.complete_frame(
            pending, self.hidden[:batch],
            lambda step, scores: self._select(batch, scores, None if noise is None else noise[:, step]))
        embeds = frame_embeds + self.text[:batch]
        positions = self.positions[:batch]
        cos, sin = talker.rotary(_positions3(positions + self.deltas[:batch]), embeds.dtype)
        out = decode_rows(talker.model.layers, embeds, cos, sin, self.cache, self.slots[:batch], positions, length)
        norm = talker.model.norm
        out = rms_norm(out, norm.weight, norm.variance_epsilon)
        self.codes[:batch, 0].copy_(pending)
        self.codes[:batch, 1:].copy_(residual)
        self.logits[:batch].copy_(talker.codec_head(out)[:, -1])
        self.next_hidden[:batch].copy_(out)
