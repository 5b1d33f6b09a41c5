"""Qwen3 decoder building blocks shared by the talker and the code predictor.

Attribute names equal the checkpoint's (``self_attn.q_proj``, ``mlp.gate_proj``,
``input_layernorm`` ...), so ``model.safetensors`` loads unchanged.

The arithmetic follows the reference (``qwen-tts==0.1.1`` on transformers 4.57.3 with SDPA)
operation for operation, including the tensor shapes it uses, because on CPU the bits of a
matmul, of ``cos`` and of ``silu`` depend on the shape they are computed in:

* a prefill runs one sequence at a time in exactly the reference's shapes;
* batched decode keeps every row bit-identical to the same row computed alone
  (:class:`BatchInvariantOps`), and attends per row over that row's own valid length;
* rotary tables are computed per position in the reference's decode shapes
  (:class:`TalkerRotary`, :class:`CodePredictorRotary`).

This is what makes greedy codes of a batched request equal the same request alone and the
reference ``generate()``, bit for bit.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from omni_backend.engine.kv_cache import StaticKVCache

__all__ = [
    "BatchInvariantOps",
    "RMSNorm",
    "MLP",
    "Attention",
    "DecoderLayer",
    "TalkerRotary",
    "CodePredictorRotary",
    "rotate_half",
]

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"silu": F.silu}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"hidden_act {name!r} is not supported (known: {', '.join(_ACTIVATIONS)})") from None


# --------------------------------------------------------------------------- batch invariance


class BatchInvariantOps:
    """Batched ops whose every row equals the same row computed alone.

    On CPU, ``F.linear`` of ``[B, K]`` rows gives different bits per row than ``[1, K]`` (MKL
    picks other kernels for other M), and ``silu`` of a flattened ``[B, I]`` tensor sends other
    elements through its scalar tail loop than ``[1, I]``. Here a batched linear runs as a batch
    of single-row matmuls (``bmm`` against the expanded weight: no copy, one call), element-wise
    ops see rows laid apart (:meth:`rows_apart`), and each op is checked once per shape against
    the per-row computation; shapes that fail the check fall back to a loop over rows. With ``enabled=False`` plain batched ops are used (faster, not
    batch-invariant).
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._verdicts: dict[tuple, bool] = {}

    # -- probing
    def _exact(self, key: tuple, batched: Callable[..., torch.Tensor], single: Callable[..., torch.Tensor],
               *like: torch.Tensor) -> bool:
        """Whether ``batched(*xs)`` row ``b`` equals ``single(*(x[b:b+1] for x in xs))``, checked once
        per key on random tensors with the sizes and strides of ``like``."""
        key = key + (torch.get_num_threads(),)  # on CPU some kernels split work by thread count
        verdict = self._verdicts.get(key)
        if verdict is None:
            generator = torch.Generator(device=like[0].device).manual_seed(1234)
            probes = [torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device)
                      .normal_(generator=generator) for x in like]
            with torch.inference_mode():
                together = batched(*probes)
                verdict = all(torch.equal(together[b:b + 1], single(*(p[b:b + 1] for p in probes)))
                              for b in range(like[0].shape[0]))
            self._verdicts[key] = verdict
        return verdict

    @property
    def fallbacks(self) -> list[tuple]:
        """Shapes that run row by row because the batched op was not batch-invariant."""
        return [k for k, ok in self._verdicts.items() if not ok]

    # -- ops
    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``F.linear`` of ``x`` ``[B, M, K]`` whose row ``b`` equals ``F.linear(x[b:b+1], ...)``."""
        if x.shape[0] == 1:
            return F.linear(x, weight, bias)
        if not self.enabled:
            return self._gemm_linear(x, weight, bias)
        key = ("linear", tuple(x.shape), tuple(x.stride()), tuple(weight.shape), bias is not None, x.dtype,
               x.device.type)
        if self._exact(key, lambda t: self._bmm_linear(t, weight, bias), lambda t: F.linear(t, weight, bias), x):
            return self._bmm_linear(x, weight, bias)
        return torch.cat([F.linear(x[b:b + 1], weight, bias) for b in range(x.shape[0])])

    # On CPU (one thread), MKL runs 2-3 rows through another kernel than 4: every weight of a
    # random ``small`` frame once takes 28.3 ms at 2 rows, 32.3 at 3, 27.3 at 4. Batches of 2-3
    # rows are padded to 4 (perf/RESULTS.md).
    MIN_GEMM_ROWS = 4

    @classmethod
    def _gemm_linear(cls, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if x.device.type != "cpu" or rows >= cls.MIN_GEMM_ROWS:
            return F.linear(x, weight, bias)
        padded = x.new_zeros(cls.MIN_GEMM_ROWS, x.shape[-1])
        padded[:rows] = x.reshape(rows, -1)
        return F.linear(padded, weight, bias)[:rows].view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def _bmm_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        batch, rows, _ = x.shape
        w = weight.t().unsqueeze(0).expand(batch, -1, -1)
        if bias is None:
            return torch.bmm(x, w)
        return torch.baddbmm(bias.expand(batch, rows, -1), x, w)

    def elementwise(self, name: str, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``fn(x)`` for an element-wise ``fn`` whose vector and scalar code paths may differ."""
        if x.shape[0] == 1 or not self.enabled:
            return fn(x)
        x = self.rows_apart(x)
        key = (name, tuple(x.shape), tuple(x.stride()), x.dtype, x.device.type)
        if self._exact(key, fn, fn, x):
            return fn(x)
        return torch.cat([fn(x[b:b + 1]) for b in range(x.shape[0])])

    @staticmethod
    def rows_apart(x: torch.Tensor) -> torch.Tensor:
        """``x`` with each batch row contiguous and the rows apart in memory, so no kernel can
        run them as one stretch: an element-wise kernel then splits every row into its vector
        body and scalar tail exactly as it splits that row alone. (A flattened ``[B, I]`` puts
        other elements in the tail, and the two paths of a transcendental like ``silu`` round a
        few inputs differently: too rarely for a probe on random data to notice.)"""
        row = x[0].numel()
        if x[0].is_contiguous() and x.stride(0) > row:
            return x
        padded = x.new_empty(x.shape[0], row + 1)[:, :row]
        padded.copy_(x.reshape(x.shape[0], row))
        return padded.view(x.shape)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  scale: float) -> torch.Tensor:
        """SDPA of rows that all have the same key length (``q`` ``[B, heads, n, dim]``). The CPU
        kernel splits work by batch x heads and threads, so a batch is checked against single
        rows; when it differs the rows run one by one."""
        def sdpa(q_, k_, v_):
            return F.scaled_dot_product_attention(q_, k_, v_, dropout_p=0.0, is_causal=causal, scale=scale,
                                                  enable_gqa=True)

        if q.shape[0] == 1:
            return sdpa(q, k, v)
        if self.enabled:
            key = ("sdpa", causal, tuple(q.shape), tuple(q.stride()), tuple(k.shape), tuple(k.stride()),
                   tuple(v.stride()), q.dtype, q.device.type)
            if not self._exact(key, sdpa, sdpa, q, k, v):
                return torch.cat([sdpa(q[b:b + 1], k[b:b + 1], v[b:b + 1]) for b in range(q.shape[0])])
        return sdpa(q, k, v)


# --------------------------------------------------------------------------- norms and MLP


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class MLP(nn.Module):
    """SwiGLU feed-forward: ``down(act(gate(x)) * up(x))``."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.hidden_act = hidden_act
        self.act_fn = activation(hidden_act)

    def forward(self, x: torch.Tensor, ops: BatchInvariantOps) -> torch.Tensor:
        gate = ops.elementwise(self.hidden_act, self.act_fn, ops.linear(x, self.gate_proj.weight))
        return ops.linear(gate * ops.linear(x, self.up_proj.weight), self.down_proj.weight)


# --------------------------------------------------------------------------- rotary embeddings


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def default_inv_freq(rope_theta: float, head_dim: int) -> torch.Tensor:
    """Inverse frequencies of the default RoPE (computed as transformers computes them)."""
    return 1.0 / (rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim))


class TalkerRotary:
    """The talker's multimodal RoPE with interleaved sections. TTS uses equal temporal, height and
    width positions, which makes it plain RoPE in value; the bits are reproduced by computing
    the three copies and the interleaved selection the way the reference does.

    ``prefill(length)`` computes positions ``0..length-1`` in one tensor (the reference's prefill
    shape). Decode positions come from a per-position table filled lazily, each position computed
    alone (the reference's decode shape).
    """

    def __init__(self, rope_theta: float, head_dim: int, mrope_section: tuple[int, ...], interleaved: bool,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.inv_freq = default_inv_freq(rope_theta, head_dim).to(device)
        self.head_dim = head_dim
        self.mrope_section = list(mrope_section)
        self.interleaved = interleaved
        self.dtype = dtype
        self.device = device
        self._cos = torch.empty(0, head_dim, dtype=dtype, device=device)
        self._sin = torch.empty(0, head_dim, dtype=dtype, device=device)

    def _compute(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[1, 1, L, D]`` for a single sequence at ``positions`` ``[L]``."""
        position_ids = positions.view(1, 1, -1).expand(3, 1, -1)
        inv_freq_expanded = self.inv_freq[None, None, :, None].float().expand(3, position_ids.shape[1], -1, 1)
        position_ids_expanded = position_ids[:, :, None, :].float()
        freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(2, 3)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * 1.0).to(self.dtype)
        sin = (emb.sin() * 1.0).to(self.dtype)
        return self._select(cos), self._select(sin)

    def _select(self, table: torch.Tensor) -> torch.Tensor:
        """Merge the three position copies ``[3, B, L, D]`` into ``[B, 1, L, D]``."""
        section = self.mrope_section
        if self.interleaved:
            half = table[..., : self.head_dim // 2]
            merged = half[0].clone()
            modality = len(section)
            for i, n in enumerate(section[1:], 1):
                merged[..., i:n * modality:modality] = half[i, ..., i:n * modality:modality]
            return torch.cat([merged] * 2, dim=-1).unsqueeze(1)
        doubled = section * 2
        return torch.cat([m[i % 3] for i, m in enumerate(table.split(doubled, dim=-1))], dim=-1).unsqueeze(1)

    def prefill(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._compute(torch.arange(length, device=self.device))

    def ensure(self, upto: int) -> None:
        """Fill the decode table for positions ``< upto``."""
        have = self._cos.shape[0]
        if upto <= have:
            return
        size = max(upto, 2 * have, 64)
        cos = torch.empty(size, self.head_dim, dtype=self.dtype, device=self.device)
        sin = torch.empty_like(cos)
        cos[:have] = self._cos
        sin[:have] = self._sin
        for p in range(have, size):
            c, s = self._compute(torch.tensor([p], device=self.device))
            cos[p] = c[0, 0, 0]
            sin[p] = s[0, 0, 0]
        self._cos, self._sin = cos, sin

    def decode(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[B, 1, 1, D]`` for one new position per row."""
        self.ensure(int(positions.max()) + 1)
        return self._cos[positions][:, None, None, :], self._sin[positions][:, None, None, :]


class CodePredictorRotary:
    """Plain RoPE of the code predictor. Its positions are the same for every frame (a 2-token
    prefill at 0..1, then one token per step), so all tables are computed once, each in the
    reference's shape."""

    def __init__(self, rope_theta: float, head_dim: int, num_steps: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.inv_freq = default_inv_freq(rope_theta, head_dim).to(device)
        self.dtype = dtype
        self.tables: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.prefill_table = self._compute(torch.arange(2, device=device))
        for position in range(2, num_steps + 1):
            self.tables[position] = self._compute(torch.tensor([position], device=device))

    def _compute(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[1, 1, L, D]``."""
        position_ids = positions.unsqueeze(0)
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        position_ids_expanded = position_ids[:, None, :].float()
        freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * 1.0).to(self.dtype)
        sin = (emb.sin() * 1.0).to(self.dtype)
        return cos.unsqueeze(1), sin.unsqueeze(1)

    def at(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tables[position]


# --------------------------------------------------------------------------- attention


class Attention(nn.Module):
    """Grouped-query attention with per-head RMSNorm on queries and keys (Qwen3)."""

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, rms_norm_eps: float,
                 bias: bool = False) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scaling = head_dim ** -0.5
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=bias)
        self.q_norm = RMSNorm(head_dim, eps=rms_norm_eps)
        self.k_norm = RMSNorm(head_dim, eps=rms_norm_eps)

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ops: BatchInvariantOps):
        shape = (*x.shape[:-1], -1, self.head_dim)
        q = self.q_norm(ops.linear(x, self.q_proj.weight, self.q_proj.bias).view(shape)).transpose(1, 2)
        k = self.k_norm(ops.linear(x, self.k_proj.weight, self.k_proj.bias).view(shape)).transpose(1, 2)
        v = ops.linear(x, self.v_proj.weight, self.v_proj.bias).view(shape).transpose(1, 2)
        q = (q * cos) + (rotate_half(q) * sin)
        k = (k * cos) + (rotate_half(k) * sin)
        return q, k, v

    def _sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=causal, scale=self.scaling,
                                              enable_gqa=True)

    def _out(self, attn: torch.Tensor, x: torch.Tensor, ops: BatchInvariantOps) -> torch.Tensor:
        attn = attn.transpose(1, 2).contiguous().reshape(*x.shape[:-1], -1).contiguous()
        return ops.linear(attn, self.o_proj.weight, self.o_proj.bias)

    def prefill(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ops: BatchInvariantOps,
                cache: StaticKVCache, layer: int, slot: int) -> torch.Tensor:
        """One sequence ``x`` ``[1, L, H]`` from position 0: causal attention over itself; its keys
        and values go to positions ``0..L-1`` of ``slot``."""
        q, k, v = self._qkv(x, cos, sin, ops)
        cache.write_prefix(layer, slot, k, v)
        return self._out(self._sdpa(q, k, v, causal=x.shape[1] > 1), x, ops)

    def prefill_rows(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ops: BatchInvariantOps,
                     cache: StaticKVCache, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """Several right-padded sequences ``x`` ``[N, L, H]`` from position 0, row ``b`` into
        ``slots[b]``: causal attention keeps every real position off the padding after it. The
        padding's keys land past each sequence's end, where decoding masks and overwrites them."""
        q, k, v = self._qkv(x, cos, sin, ops)
        length = x.shape[1]
        cache.keys[layer][slots, :, :length] = k
        cache.values[layer][slots, :, :length] = v
        return self._out(self._sdpa(q, k, v, causal=True), x, ops)

    def decode(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ops: BatchInvariantOps,
               cache: StaticKVCache, layer: int, slots: torch.Tensor, positions: torch.Tensor,
               slot_list: list[int], lengths: list[int]) -> torch.Tensor:
        """One new token per row ``x`` ``[B, 1, H]`` at ``positions``; row ``b`` attends to the
        ``lengths[b]`` keys of its own slot (padding never enters a softmax)."""
        q, k, v = self._qkv(x, cos, sin, ops)
        cache.write_rows(layer, slots, positions, k, v)
        rows = []
        for b, (slot, length) in enumerate(zip(slot_list, lengths)):
            keys, values = cache.view(layer, slot, length)
            rows.append(self._sdpa(q[b:b + 1], keys, values, causal=False))
        return self._out(torch.cat(rows) if len(rows) > 1 else rows[0], x, ops)

    def block(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ops: BatchInvariantOps,
              cache: StaticKVCache, layer: int, start: int) -> torch.Tensor:
        """``x`` ``[B, n, H]``: every row at the same positions ``start..start+n-1`` of slots
        ``0..B-1`` (the code predictor); each row attends causally to its own ``start+n`` keys."""
        q, k, v = self._qkv(x, cos, sin, ops)
        rows, n = x.shape[0], x.shape[1]
        cache.write_block(layer, rows, start, k, v)
        if start == 0:
            attn = ops.attention(q, k, v, causal=n > 1, scale=self.scaling)
        else:
            keys, values = cache.rows(layer, rows, start + n)
            attn = ops.attention(q, keys, values, causal=False, scale=self.scaling)
        return self._out(attn, x, ops)


class DecoderLayer(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 rms_norm_eps: float, hidden_act: str, attention_bias: bool = False) -> None:
        super().__init__()
        self.self_attn = Attention(hidden_size, num_heads, num_kv_heads, head_dim, rms_norm_eps, attention_bias)
        self.mlp = MLP(hidden_size, intermediate_size, hidden_act)
        self.input_layernorm = RMSNorm(hidden_size, eps=rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps=rms_norm_eps)

    def forward(self, x: torch.Tensor, attend: Callable[[torch.Tensor], torch.Tensor],
                ops: BatchInvariantOps) -> torch.Tensor:
        """``attend(normed_x)`` runs this layer's attention in the caller's mode (prefill,
        decode or block)."""
        h = x + attend(self.input_layernorm(x))
        return h + self.mlp(self.post_attention_layernorm(h), ops)
