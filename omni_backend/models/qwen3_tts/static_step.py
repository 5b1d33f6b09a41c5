"""The whole per-frame decode step over static buffers: what a CUDA graph captures.

:class:`StaticFrameStep` runs one engine step for the batch rows ``0..B-1``, where **row ``b`` is
cache slot ``b``** (the scheduler hands out the lowest free slots, so the running requests sit in
the first rows; idle slots inside the bucket are padding rows whose results are ignored and
whose cache writes land in their own unused slot). Nothing in :meth:`StaticFrameStep.run` reads a
Python value that changes between steps, allocates outside the caching allocator, or syncs with
the host, so it can be captured once per batch-size bucket and replayed:

1. codebook-0 embedding of each row's pending token (``pending`` buffer);
2. the code predictor's 2-token prefill and 14 steps, each followed by token selection inside
   the step (greedy argmax, or temperature / top-k / top-p sampling by the exponential race
   ``argmax(p / E)`` whose ``E = -log U`` noise is drawn inside the step by
   :func:`~omni_backend.engine.counter_rng.uniform` from the request's seed and frame counter,
   so sampling stays reproducible per request, whatever it is batched with, with no host work);
3. the next talker input (sum of the 16 codebook embeddings + the row's trailing-text
   embedding) and one talker decode position per row, attending over the first ``length``
   positions of its slot with a length mask (static shapes: ``length`` is a bucket from
   :func:`length_buckets` holding every row's position, one graph per bucket, so a step reads the
   cache up to the batch's furthest position rounded up, not the whole ``max_model_len``;
   grouped-query heads are folded into the query length, so the cache is never copied);
4. the reference's codebook-0 processors (repetition penalty over a per-slot ``seen`` mask,
   min-new-tokens, suppressed ids) and selection; ``pending`` / ``hidden`` / ``seen`` are
   updated in place for the next step.

The arithmetic is plain batched torch (no :class:`BatchInvariantOps`): it is the GPU path, where
greedy codes with graphs must equal greedy codes of this same function run eagerly
(``enforce_eager``), not the CPU reference bits. The CPU engine never uses this class unless asked
(``Qwen3TTSRunner(static_step=True)``, which tests use to exercise it without a GPU).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from omni_backend.engine.counter_rng import uniform

from .decode_step import LayerWeights, _rms_cast, _rms_fp32, signed_sin, split_qkv

__all__ = ["StaticFrameStep", "length_buckets"]

SHORTEST_LENGTH_BUCKET = 256


def length_buckets(max_model_len: int, shortest: int = SHORTEST_LENGTH_BUCKET) -> list[int]:
    """Attention lengths a step is captured for: doubling from ``shortest``, and ``max_model_len``."""
    out, length = [], shortest
    while length < max_model_len:
        out.append(length)
        length *= 2
    return out + [max_model_len]


class StaticFrameStep:
    def __init__(self, talker, cache, cp_cache, rotary, cp_rotary, rows: int, max_model_len: int,
                 eos_id: int, suppressed: tuple[int, ...]) -> None:
        self.talker = talker
        self.cp = talker.code_predictor
        self.cache, self.cp_cache = cache, cp_cache
        self.rows = rows
        self.max_len = max_model_len
        weight = talker.codec_head.weight
        device, dtype = weight.device, weight.dtype
        self.device, self.dtype = device, dtype
        self.rms = _rms_fp32 if dtype == torch.float32 else _rms_cast
        self.talker_layers = [LayerWeights(layer) for layer in talker.model.layers]
        self.cp_layers = [LayerWeights(layer) for layer in self.cp.model.layers]
        self.talker_norm = (talker.model.norm.weight, talker.model.norm.variance_epsilon)
        self.cp_norm = (self.cp.model.norm.weight, self.cp.model.norm.variance_epsilon)
        self.codec_embedding = talker.model.codec_embedding.weight
        self.codec_head = weight
        self.lm_heads = [h.weight for h in self.cp.lm_head]
        self.cp_embeddings = [e.weight for e in self.cp.model.codec_embedding]
        proj = self.cp.small_to_mtp_projection
        self.projection = None if proj is None else (proj.weight, proj.bias)
        self.num_steps = self.cp.num_steps
        tc, cc = talker.config, self.cp.config
        self.hidden_size = tc.hidden_size
        self.vocab, self.cp_vocab = tc.vocab_size, cc.vocab_size
        self.talker_groups = tc.num_attention_heads // tc.num_key_value_heads
        self.cp_groups = cc.num_attention_heads // cc.num_key_value_heads

        # rotary tables: talker positions 0..max_len-1 in one tensor; code predictor per start
        cos, sin = rotary._compute(torch.arange(max_model_len, device=device))
        self.cos = cos[0, 0].contiguous()                   # [L, D]
        self.sin = signed_sin(sin[0, 0]).contiguous()
        cos, sin = cp_rotary.prefill_table
        self.cp_tables = {0: (cos, signed_sin(sin))}
        for position, (cos, sin) in cp_rotary.tables.items():
            self.cp_tables[position] = (cos, signed_sin(sin))

        # per-token masks of the codebook-0 processors
        vocab = torch.arange(self.vocab, device=device)
        self.eos_id = eos_id
        self.eos_mask = (vocab == eos_id).view(1, -1)
        self.suppress_mask = torch.zeros(1, self.vocab, dtype=torch.bool, device=device)
        if suppressed:
            self.suppress_mask[0, list(suppressed)] = True
        self.key_index = torch.arange(max_model_len, device=device).view(1, 1, 1, -1)

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
        self.min_new = torch.zeros(rows, **long)
        # sampling noise: a request's seed; the draw counter is ``generated`` (one more per frame)
        self.seed = torch.zeros(rows, **long)
        self.cp_noise_index = torch.arange(self.num_steps * self.cp_vocab, **long)
        self.talker_noise_index = torch.arange(self.vocab, **long) + self.num_steps * self.cp_vocab
        # outputs
        self.codes = torch.zeros(rows, 1 + self.num_steps + 1, **long)    # frame (16) + next codebook 0

    # ------------------------------------------------------------------ host side
    def set_row(self, row: int, pending: int, hidden: torch.Tensor, generated: list[int], params,
                seed: int = 0) -> None:
        """A request entered ``row`` (its slot): its first pending token, prefill hidden state,
        processors' history, sampling parameters and seed."""
        self.pending[row] = pending
        self.seed[row] = int(seed)
        self.hidden[row].copy_(hidden.reshape(1, -1))
        self.seen[row].zero_()
        if generated:
            self.seen[row, torch.tensor(generated, dtype=torch.long, device=self.device)] = True
        self.do_sample[0, row] = bool(params.do_sample)
        self.do_sample[1, row] = bool(params.subtalker_do_sample)
        self.temperature[0, row] = float(params.temperature or 1.0)
        self.temperature[1, row] = float(params.subtalker_temperature or 1.0)
        self.top_k[0, row] = int(params.top_k or 0)
        self.top_k[1, row] = int(params.subtalker_top_k or 0)
        self.top_p[0, row] = float(params.top_p if params.top_p is not None else 1.0)
        self.top_p[1, row] = float(params.subtalker_top_p if params.subtalker_top_p is not None else 1.0)
        self.penalty[row] = float(params.repetition_penalty)
        self.min_new[row] = int(params.min_new_tokens)

    # ------------------------------------------------------------------ the captured step
    def run(self, batch: int, sample: bool = True, length: Optional[int] = None) -> None:
        """One frame for rows ``0..batch-1``: fills ``codes[:batch]`` with the 16 codebooks of the
        pending frame and the next codebook-0 token, and advances ``pending`` / ``hidden`` /
        ``seen`` / the caches. ``sample=False`` leaves the sampling math out (every row greedy).
        The talker attends over cache positions ``0..length-1`` (default: all); every row's
        ``position`` must be below ``length``."""
        pending = self.pending[:batch]
        cb0_embed = F.embedding(pending.view(-1, 1), self.codec_embedding)          # [B, 1, H]
        cp_noise = talker_noise = None
        if sample:   # exponential noise E = -log U, a function of (seed, frame counter) per row
            seed, counter = self.seed[:batch], self.generated[:batch]
            cp_noise = -torch.log(uniform(seed, counter, self.cp_noise_index)).view(batch, self.num_steps, -1)
            talker_noise = -torch.log(uniform(seed, counter, self.talker_noise_index))
        codes = self._code_predictor(batch, self.hidden[:batch], cb0_embed, cp_noise)  # [B, 15]
        parts = [cb0_embed] + [F.embedding(codes[:, i:i + 1], w) for i, w in enumerate(self.cp_embeddings)]
        embeds = torch.cat(parts, dim=1).sum(1, keepdim=True) + self.text[:batch]
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

    # -- pieces
    def _qkv(self, w: LayerWeights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        if w.wqkv is not None:   # one GEMM for q | k | v, one norm and one rotation for q | k
            return split_qkv(w, F.linear(x, w.wqkv, w.bqkv), self.rms, cos, sin)
        shape = (x.shape[0], x.shape[1], -1, w.head_dim)
        q = self.rms(F.linear(x, w.wq, w.bq).view(shape), w.q_norm, w.qk_eps).transpose(1, 2)
        k = self.rms(F.linear(x, w.wk, w.bk).view(shape), w.k_norm, w.qk_eps).transpose(1, 2)
        v = F.linear(x, w.wv, w.bv).view(shape).transpose(1, 2)
        q = (q * cos) + (q.roll(w.half, -1) * sin)
        k = (k * cos) + (k.roll(w.half, -1) * sin)
        return q, k, v

    def _finish_layer(self, w: LayerWeights, attn: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        attn = attn.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
        h = x + F.linear(attn, w.wo, w.bo)
        m = self.rms(h, w.ln_post, w.eps)
        if w.wgu is not None:   # one GEMM for gate | up
            gate_up = F.linear(m, w.wgu)
            return h + F.linear(w.act(gate_up[..., :w.inter]) * gate_up[..., w.inter:], w.down)
        return h + F.linear(w.act(F.linear(m, w.gate)) * F.linear(m, w.up), w.down)

    def _cp_run(self, embeds: torch.Tensor, start: int) -> torch.Tensor:
        if self.projection is not None:
            embeds = F.linear(embeds, *self.projection)
        cos, sin = self.cp_tables[start]
        rows, n = embeds.shape[0], embeds.shape[1]
        groups = self.cp_groups
        hidden = embeds
        for index, w in enumerate(self.cp_layers):
            q, k, v = self._qkv(w, self.rms(hidden, w.ln_in, w.eps), cos, sin)
            keys, values = self.cp_cache.keys[index], self.cp_cache.values[index]
            keys[:rows, :, start:start + n].copy_(k)
            values[:rows, :, start:start + n].copy_(v)
            k_all, v_all = keys[:rows, :, :start + n], values[:rows, :, :start + n]
            if groups > 1:   # kv head j serves query heads j*groups .. j*groups+groups-1 (expand: no host sync)
                shape = (rows, k_all.shape[1] * groups, k_all.shape[2], k_all.shape[3])
                k_all = k_all[:, :, None].expand(-1, -1, groups, -1, -1).reshape(shape)
                v_all = v_all[:, :, None].expand(-1, -1, groups, -1, -1).reshape(shape)
            attn = F.scaled_dot_product_attention(q, k_all, v_all, dropout_p=0.0, is_causal=start == 0,
                                                  scale=w.scaling)
            hidden = self._finish_layer(w, attn, hidden)
        return self.rms(hidden, *self.cp_norm)

    def _code_predictor(self, batch: int, talker_hidden: torch.Tensor, cb0_embed: torch.Tensor,
                        noise: Optional[torch.Tensor]) -> torch.Tensor:
        hidden = self._cp_run(torch.cat((talker_hidden, cb0_embed), dim=1), 0)
        logits = F.linear(hidden, self.lm_heads[0])[:, -1, :].float()
        codes = [self._select(logits, 1, batch, None if noise is None else noise[:, 0])]
        for step in range(1, self.num_steps):
            embeds = F.embedding(codes[-1].view(-1, 1), self.cp_embeddings[step - 1])
            hidden = self._cp_run(embeds, step + 1)
            logits = F.linear(hidden, self.lm_heads[step])[:, -1, :].float()
            codes.append(self._select(logits, 1, batch, None if noise is None else noise[:, step]))
        return torch.stack(codes, dim=1)

    def _talker(self, batch: int, embeds: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        position = self.position[:batch]
        cos = self.cos[position].view(batch, 1, 1, -1)
        sin = self.sin[position].view(batch, 1, 1, -1)
        rows = torch.arange(batch, device=self.device)
        # key j of row b is valid when j <= position[b]
        mask = (self.key_index[..., :length] <= position.view(-1, 1, 1, 1))   # [B, 1, 1, length]
        groups = self.talker_groups
        hidden = embeds
        for index, w in enumerate(self.talker_layers):
            q, k, v = self._qkv(w, self.rms(hidden, w.ln_in, w.eps), cos, sin)   # q [B, Hq, 1, D]
            keys, values = self.cache.keys[index], self.cache.values[index]
            keys[rows, :, position] = k[:, :, 0]
            values[rows, :, position] = v[:, :, 0]
            kv_heads = keys.shape[1]
            # grouped query heads as query positions of their kv head: no copy of the cache
            qg = q.reshape(batch, kv_heads, groups, w.head_dim)
            attn = F.scaled_dot_product_attention(qg, keys[:batch, :, :length], values[:batch, :, :length],
                                                  attn_mask=mask, dropout_p=0.0, is_causal=False, scale=w.scaling)
            attn = attn.reshape(batch, kv_heads * groups, 1, w.head_dim)
            hidden = self._finish_layer(w, attn, hidden)
        hidden = self.rms(hidden, *self.talker_norm)
        logits = F.linear(hidden, self.codec_head)[:, -1, :].float()
        return logits, hidden

    def _processors(self, batch: int, scores: torch.Tensor) -> torch.Tensor:
        """Repetition penalty (``seen``), min-new-tokens and suppressed ids, as ``TokenRules``."""
        penalty = self.penalty[:batch].view(-1, 1)
        penalized = torch.where(scores < 0, scores * penalty, scores / penalty)
        scores = torch.where(self.seen[:batch], penalized, scores)
        too_early = self.generated[:batch].view(-1, 1) < self.min_new[:batch].view(-1, 1)
        scores = scores.masked_fill(self.eos_mask & too_early, -math.inf)
        return scores.masked_fill(self.suppress_mask, -math.inf)

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
