"""The graph-safe static strategy: the whole per-frame decode step over static buffers, what a
CUDA graph captures.

:class:`GraphSafeStaticStep` runs one engine step for the batch rows ``0..B-1``, where **row
``b`` is cache slot ``b``** (the scheduler hands out the lowest free slots, so the running
requests sit in the first rows; idle slots inside the bucket are padding rows whose results are
ignored and whose cache writes land in their own unused slot). Nothing in
:meth:`GraphSafeStaticStep.run` reads a Python value that changes between steps, allocates
outside the caching allocator, or syncs with the host, so it can be captured once per
batch-size bucket and replayed:

1. codebook-0 embedding of each row's pending token (``pending`` buffer);
2. the code predictor's 2-token prefill and 14 steps, each followed by token selection inside
   the step (greedy argmax, or temperature / top-k / top-p sampling by the exponential race
   ``argmax(p / E)`` whose ``E = -log U`` noise is drawn inside the step by
   :func:`~omni_backend.engine.counter_rng.uniform` from the request's seed and frame counter,
   so sampling stays reproducible per request, whatever it is batched with, with no host work);
3. the next talker input (sum of the 16 codebook embeddings + the row's trailing-text
   embedding) and one talker decode position per row, attending over the first ``length``
   positions of its slot with a length mask (static shapes: ``length`` is a bucket from
   :func:`~omni_backend.engine.kv_cache.length_buckets` holding every row's position, one graph
   per bucket, so a step reads the cache up to the batch's furthest position rounded up, not
   the whole ``max_model_len``;
   grouped-query heads are folded into the query length, so the cache is never copied);
4. the codebook-0 processors, the engine's :class:`~omni_backend.engine.sampling.TokenRules`
   applied to the whole batch at once (repetition penalty over a per-slot ``seen`` mask, eos
   where the engine bans it (``ban_eos``: min_new_tokens), suppressed ids), and selection;
   ``pending`` / ``hidden`` / ``seen`` are updated in place for the next step.

The layers are :class:`~.decode.Qwen3Decode`'s with the :class:`GraphSafeStatic` numerics:
plain batched torch (no :class:`~.exact_step.BatchInvariantOps`). It is the GPU path, where
greedy codes with graphs must equal greedy codes of this same function run eagerly
(``enforce_eager``), not the CPU reference bits. The CPU engine never uses it unless asked
(``Qwen3TTSRunner(static_step=True)``, which tests use to exercise it without a GPU).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from omni_backend.engine import SamplingParams
from omni_backend.engine.counter_rng import uniform
from omni_backend.engine.kv_cache import StaticKVCache
from omni_backend.engine.sampling import TokenRules

from .decode import DecodeNumerics, LayerWeights, Qwen3Decode, signed_sin
from .rotary import TalkerRotary
from .sampling_params import Qwen3SamplingParams

__all__ = ["GraphSafeStatic", "GraphSafeStaticStep"]


class GraphSafeStatic(DecodeNumerics):
    """Plain batched ops with static shapes: no per-row work, nothing read on the host."""

    linear = staticmethod(F.linear)

    def activate(self, w: LayerWeights, gate: torch.Tensor) -> torch.Tensor:
        return w.act(gate)

    def fuse_gate_up(self, positions: int) -> bool:
        return True

    def merge_heads(self, attn: torch.Tensor, rows: int, positions: int) -> torch.Tensor:
        return attn.transpose(1, 2).reshape(rows, positions, -1)

    def block_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
                        values: torch.Tensor, start: int, scale: float) -> torch.Tensor:
        groups = q.shape[1] // keys.shape[1]
        if groups > 1:   # kv head j serves query heads j*groups .. j*groups+groups-1 (expand: no host sync)
            shape = (keys.shape[0], keys.shape[1] * groups, keys.shape[2], keys.shape[3])
            keys = keys[:, :, None].expand(-1, -1, groups, -1, -1).reshape(shape)
            values = values[:, :, None].expand(-1, -1, groups, -1, -1).reshape(shape)
        return F.scaled_dot_product_attention(q, keys, values, dropout_p=0.0, is_causal=start == 0, scale=scale)

    def sum_codebooks(self, embeds: torch.Tensor) -> torch.Tensor:
        return embeds.sum(1, keepdim=True)


class GraphSafeStaticStep:
    """One engine step of rows ``0..B-1`` over static buffers (see the module docstring)."""

    def __init__(self, decode: Qwen3Decode, cache: StaticKVCache, cp_cache: StaticKVCache, rotary: TalkerRotary,
                 rows: int, max_model_len: int, rules: TokenRules) -> None:
        self.decode = decode
        self.numerics = GraphSafeStatic()
        self.cache, self.cp_cache = cache, cp_cache
        self.rows = rows
        self.max_len = max_model_len
        device, dtype = decode.device, decode.dtype
        self.device, self.dtype = device, dtype
        self.num_steps = decode.num_steps
        self.hidden_size = decode.codec_head.shape[1]
        self.vocab, self.cp_vocab = decode.codec_head.shape[0], decode.lm_heads[0].shape[0]

        # the talker's rotary table for positions 0..max_len-1, computed in one tensor
        cos, sin = rotary.table(max_model_len)
        self.cos = cos.contiguous()                   # [L, D]
        self.sin = signed_sin(sin).contiguous()
        self.key_index = torch.arange(max_model_len, device=device).view(1, 1, 1, -1)
        self.rules = rules

        # ---- static buffers (row b = slot b)
        long = dict(dtype=torch.long, device=device)
        f32 = dict(dtype=torch.float32, device=device)
        self.pending = torch.zeros(rows, **long)                          # codebook 0 to complete
        self.hidden = torch.zeros(rows, 1, self.hidden_size, dtype=dtype, device=device)
        self.text = torch.zeros(rows, 1, self.hidden_size, dtype=dtype, device=device)
        self.position = torch.zeros(rows, **long)                         # talker position of the new token
        self.generated = torch.zeros(rows, **long)                        # codebook-0 tokens so far
        self.seen = torch.zeros(rows, self.vocab, dtype=torch.bool, device=device)
        # sampling parameters: [talker, code predictor] x rows
        self.do_sample = torch.zeros(2, rows, dtype=torch.bool, device=device)
        self.temperature = torch.ones(2, rows, **f32)
        self.top_k = torch.zeros(2, rows, **long)
        self.top_p = torch.ones(2, rows, **f32)
        self.penalty = torch.ones(rows, **f32)
        self.ban_eos = torch.zeros(rows, dtype=torch.bool, device=device)  # the engine's, set every step
        # sampling noise: a request's seed; the draw counter is ``generated`` (one more per frame)
        self.seed = torch.zeros(rows, **long)
        self.cp_noise_index = torch.arange(self.num_steps * self.cp_vocab, **long)
        self.talker_noise_index = torch.arange(self.vocab, **long) + self.num_steps * self.cp_vocab
        # outputs
        self.codes = torch.zeros(rows, 1 + self.num_steps + 1, **long)    # frame (16) + next codebook 0

    # ------------------------------------------------------------------ host side
    def set_row(self, row: int, pending: int, hidden: torch.Tensor, generated: list[int], params: SamplingParams,
                code_predictor: Qwen3SamplingParams, seed: int = 0) -> None:
        """A request entered ``row`` (its slot): its first pending token, prefill hidden state,
        processors' history, sampling parameters (the talker's, and the code predictor's with
        ``subtalker_do_sample`` resolved) and seed."""
        self.pending[row] = pending
        self.seed[row] = int(seed)
        self.hidden[row].copy_(hidden.reshape(1, -1))
        self.seen[row].zero_()
        if generated:
            self.seen[row, torch.tensor(generated, dtype=torch.long, device=self.device)] = True
        self.do_sample[0, row] = bool(params.do_sample)
        self.do_sample[1, row] = bool(code_predictor.subtalker_do_sample)
        self.temperature[0, row] = float(params.temperature or 1.0)
        self.temperature[1, row] = float(code_predictor.subtalker_temperature or 1.0)
        self.top_k[0, row] = int(params.top_k or 0)
        self.top_k[1, row] = int(code_predictor.subtalker_top_k or 0)
        self.top_p[0, row] = float(params.top_p if params.top_p is not None else 1.0)
        self.top_p[1, row] = float(code_predictor.subtalker_top_p if code_predictor.subtalker_top_p is not None
                                   else 1.0)
        self.penalty[row] = float(params.repetition_penalty)

    # ------------------------------------------------------------------ the captured step
    def run(self, batch: int, sample: bool = True, length: Optional[int] = None) -> None:
        """One frame for rows ``0..batch-1``: fills ``codes[:batch]`` with the 16 codebooks of the
        pending frame and the next codebook-0 token, and advances ``pending`` / ``hidden`` /
        ``seen`` / the caches. ``sample=False`` leaves the sampling math out (every row greedy).
        The talker attends over cache positions ``0..length-1`` (default: all); every row's
        ``position`` must be below ``length``."""
        decode, num = self.decode, self.numerics
        pending = self.pending[:batch]
        cb0_embed = F.embedding(pending.view(-1, 1), decode.codec_embedding)          # [B, 1, H]
        cp_noise = talker_noise = None
        if sample:   # exponential noise E = -log U, a function of (seed, frame counter) per row
            seed, counter = self.seed[:batch], self.generated[:batch]
            cp_noise = -torch.log(uniform(seed, counter, self.cp_noise_index)).view(batch, self.num_steps, -1)
            talker_noise = -torch.log(uniform(seed, counter, self.talker_noise_index))

        def choose(step: int, logits: torch.Tensor) -> torch.Tensor:
            return self._select(logits, 1, batch, None if cp_noise is None else cp_noise[:, step])

        codes = decode.complete_frame(num, self.hidden[:batch], cb0_embed, self.cp_cache, choose)  # [B, 15]
        embeds = decode.next_talker_input(num, cb0_embed, codes, self.text[:batch])
        logits, hidden = self._talker(batch, embeds, self.max_len if length is None else length)
        scores = self._processors(batch, logits)
        token = self._select(scores, 0, batch, talker_noise)
        out = self.codes[:batch]
        out[:, 0].copy_(pending)
        out[:, 1:1 + self.num_steps].copy_(codes)
        out[:, -1].copy_(token)
        pending.copy_(token)
        self.hidden[:batch].copy_(hidden)
        self.seen[:batch].scatter_(1, token.view(-1, 1), True)

    def _talker(self, batch: int, embeds: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        position = self.position[:batch]
        cos = self.cos[position].view(batch, 1, 1, -1)
        sin = self.sin[position].view(batch, 1, 1, -1)
        rows = torch.arange(batch, device=self.device)
        # key j of row b is valid when j <= position[b]
        mask = (self.key_index[..., :length] <= position.view(-1, 1, 1, 1))   # [B, 1, 1, length]
        cache = self.cache

        def attend(index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
            keys, values = cache.keys[index], cache.values[index]      # q [B, Hq, 1, D]
            keys[rows, :, position] = k[:, :, 0]
            values[rows, :, position] = v[:, :, 0]
            kv_heads, head_dim = keys.shape[1], keys.shape[3]
            # grouped query heads as query positions of their kv head: no copy of the cache
            qg = q.reshape(batch, kv_heads, q.shape[1] // kv_heads, head_dim)
            attn = F.scaled_dot_product_attention(qg, keys[:batch, :, :length], values[:batch, :, :length],
                                                  attn_mask=mask, dropout_p=0.0, is_causal=False, scale=scale)
            return attn.reshape(batch, q.shape[1], 1, head_dim)

        return self.decode.talker(self.numerics, embeds, cos, sin, attend)

    def _processors(self, batch: int, scores: torch.Tensor) -> torch.Tensor:
        """``TokenRules.apply`` for every row at once: repetition penalty (``seen``), eos where
        ``ban_eos`` and suppressed ids, with the rules' masks."""
        penalty = self.penalty[:batch].view(-1, 1)
        penalized = torch.where(scores < 0, scores * penalty, scores / penalty)
        scores = torch.where(self.seen[:batch], penalized, scores)
        if self.rules.eos_mask is not None:
            scores = scores.masked_fill(self.rules.eos_mask & self.ban_eos[:batch].view(-1, 1), -math.inf)
        if self.rules.suppress_mask is not None:
            scores = scores.masked_fill(self.rules.suppress_mask, -math.inf)
        return scores

    def _select(self, scores: torch.Tensor, which: int, batch: int, noise: Optional[torch.Tensor]) -> torch.Tensor:
        """Greedy or sampled id per row (``which``: 0 talker, 1 code predictor); sampling follows
        ``sampling.warp`` (temperature, top-k, top-p) then draws by ``argmax(p / E)`` with the
        exponential ``noise`` (None: every row greedy)."""
        greedy = torch.argmax(scores, dim=-1)
        if noise is None:
            return greedy
        vocab = scores.shape[-1]
        s = scores / self.temperature[which, :batch].view(-1, 1)
        k = self.top_k[which, :batch]
        k = torch.where((k > 0) & (k < vocab), k, torch.full_like(k, vocab))
        descending = torch.sort(s, dim=-1, descending=True).values
        kth = descending.gather(1, (k - 1).view(-1, 1))
        s = s.masked_fill(s < kth, -math.inf)
        ascending, order = torch.sort(s, dim=-1, descending=False)
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - self.top_p[which, :batch]).view(-1, 1)
        remove[:, -1] = False
        s = s.masked_fill(remove.scatter(1, order, remove), -math.inf)
        sampled = torch.argmax(s.softmax(dim=-1) / noise, dim=-1)
        return torch.where(self.do_sample[which, :batch], sampled, greedy)
