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
  row's frame (its 2-token prefill and 14 steps, greedy argmax inside the step), then the next
  talker input (the frame's 16 codebook embeddings summed + the row's text row) runs one talker
  position -> codebook-0 logits ``[rows, vocab]`` and the talker's normed hidden state (the next
  frame's code predictor input). A step where a row samples the code predictor runs eagerly
  (:class:`~.throughput_runner.ThroughputTalkerRunner`).

The MoE block (:class:`~.moe.SparseMoeBlock`) is graph-safe as it is: routing by ``topk``,
(token, expert) pairs sorted on the device, rows per expert counted by ``histc`` over the fixed
expert range, and ``grouped_mm`` reading those offsets on the device: static shapes
(``rows * top_k`` pairs), no host read. ``tests/unit/test_qwen3_omni_graph_step.py`` runs both
steps on the meta device at the released 30B-A3B shape (a host read raises there) and checks
that they equal the eager throughput path on CPU.
"""
from __future__ import annotations

import torch

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
        self.slots = torch.arange(rows, device=device)
        self.logits = torch.zeros(rows, thinker.config.vocab_size, dtype=torch.float32, device=device)

    def run(self, batch: int, length: int) -> None:
        """Rows ``0..batch-1``: ``logits[:batch]`` of the token after ``ids``; every position is
        below ``length``."""
        thinker = self.thinker
        positions = self.positions[:batch]
        hidden = thinker.embed(self.ids[:batch].view(-1, 1))
        cos, sin = thinker.rotary(_positions3(positions), hidden.dtype)
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
        self.slots = torch.arange(rows, device=device)
        self.codes = torch.zeros(rows, groups, dtype=torch.long, device=device)      # the frame
        self.logits = torch.zeros(rows, talker.config.text.vocab_size, dtype=torch.float32, device=device)
        self.next_hidden = torch.zeros(rows, 1, hidden_size, dtype=dtype, device=device)

    def run(self, batch: int, length: int) -> None:
        """Rows ``0..batch-1``: ``codes[:batch]`` the frame of ``pending``, ``logits[:batch]`` its
        next codebook 0, ``next_hidden[:batch]`` the talker state that predicts it."""
        talker = self.talker
        pending = self.pending[:batch]
        first_embed = talker.embed_codec(pending.view(-1, 1))
        residual, residual_embeds = talker.code_predictor.predict(
            self.hidden[:batch], first_embed, lambda _step, scores: torch.argmax(scores, dim=-1))
        embeds = torch.cat([first_embed] + residual_embeds, dim=1).sum(1, keepdim=True) + self.text[:batch]
        positions = self.positions[:batch]
        cos, sin = talker.rotary(_positions3(positions), embeds.dtype)
        out = decode_rows(talker.model.layers, embeds, cos, sin, self.cache, self.slots[:batch], positions, length)
        norm = talker.model.norm
        out = rms_norm(out, norm.weight, norm.variance_epsilon)
        self.codes[:batch, 0].copy_(pending)
        self.codes[:batch, 1:].copy_(residual)
        self.logits[:batch].copy_(talker.codec_head(out)[:, -1])
        self.next_hidden[:batch].copy_(out)
