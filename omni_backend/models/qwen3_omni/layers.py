"""Decoder building blocks of the Qwen3-Omni thinker, talker and code predictor: the rotary tables,
RMSNorm, grouped-query attention with q/k norms, a growing KV cache, and the decoder layer that
holds either a dense MLP or a sparse MoE block.

Weights live in the shared Qwen3 modules (:mod:`omni_backend.models.qwen3_common.layers`:
``Attention`` with ``q_proj`` .. ``k_norm``, ``RMSNorm``, ``MLP``, the released keys); the arithmetic
here follows transformers 5's ``qwen3_omni_moe`` (the reference of record) operation for
operation and in the same tensor shapes, because on CPU the bits of a matmul or of ``cos`` depend
on the shape it runs in:

* RMSNorm in float32: ``weight * (x * rsqrt(mean(x^2) + eps))``;
* q / k normed per head, then rotated (``x * cos + rotate_half(x) * sin``);
* SDPA with ``is_causal`` for a multi-token forward and no mask for one token, and ``enable_gqa``
  when key/value heads are shared (what transformers' SDPA path passes without a padding mask);
* the KV cache concatenates as transformers' ``DynamicCache`` does.

Multimodal RoPE: the thinker and the talker rotate with three position components (time, height,
width) whose frequencies are interleaved by ``mrope_section``. For text-only input the three
components are equal, which makes it plain 1-D RoPE in value; :class:`MultimodalRotary` still
computes the three copies and the interleaving as the reference does, so that the bits are the
reference's and multimodal positions work unchanged.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from omni_backend.models.qwen3_common.layers import MLP, Attention, RMSNorm

from .config import MoeTextConfig
from .moe import SparseMoeBlock

__all__ = [
    "KVCache",
    "MultimodalRotary",
    "PlainRotary",
    "MoeDecoderLayer",
    "rms_norm",
    "attention_forward",
    "mlp_forward",
    "text_positions",
    "rotate_half",
]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _inv_freq(rope_theta: float, head_dim: int, device: torch.device | str | None) -> torch.Tensor:
    return 1.0 / (float(rope_theta) ** (torch.arange(0, head_dim, 2, dtype=torch.float, device=device) / head_dim))


def text_positions(start: int, length: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Position ids ``[3, 1, length]`` of text tokens ``start..start+length-1`` (the three M-RoPE
    components are equal for text)."""
    return torch.arange(start, start + length, device=device).view(1, 1, -1).expand(3, 1, -1)


class MultimodalRotary:
    """Interleaved M-RoPE of the thinker and talker (``Qwen3OmniMoeThinkerTextRotaryEmbedding``)."""

    def __init__(self, rope_theta: float, head_dim: int, mrope_section: Sequence[int],
                 device: torch.device | str | None = None) -> None:
        self.inv_freq = _inv_freq(rope_theta, head_dim, device)
        self.mrope_section = tuple(mrope_section)

    def _recompose(self, table: torch.Tensor) -> torch.Tensor:
        """Component 0 everywhere except every third frequency from 1 (height) and 2 (width)
        within ``3 * section`` of them; ``[3, B, L, D/2]`` -> ``[B, L, D]``."""
        merged = table[0]
        for component in (1, 2):
            index = slice(component, self.mrope_section[component] * 3, 3)
            merged[..., index] = table[component, ..., index]
        return torch.cat((merged, merged), dim=-1)

    def __call__(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[B, L, D]`` for ``position_ids`` ``[3, B, L]``."""
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=position_ids.device)
        cos, sin = freqs.cos(), freqs.sin()
        return self._recompose(cos).to(dtype), self._recompose(sin).to(dtype)


class PlainRotary:
    """1-D RoPE of the code predictor (``Qwen3OmniMoeRotaryEmbedding``)."""

    def __init__(self, rope_theta: float, head_dim: int, device: torch.device | str | None = None) -> None:
        self.inv_freq = _inv_freq(rope_theta, head_dim, device)

    def __call__(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[B, L, D]`` for ``position_ids`` ``[B, L]``."""
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=position_ids.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)


class KVCache:
    """Keys and values ``[B, kv_heads, length, D]`` per layer, grown by concatenation."""

    def __init__(self, num_layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    @property
    def length(self) -> int:
        return 0 if self.keys[0] is None else int(self.keys[0].shape[-2])

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys[layer], self.values[layer]
        # always concatenated, also the first time: SDPA then reads contiguous copies, as it does
        # from transformers' DynamicCache
        self.keys[layer] = torch.cat((k[..., :0, :] if keys is None else keys, k), dim=-2)
        self.values[layer] = torch.cat((v[..., :0, :] if values is None else values, v), dim=-2)
        return self.keys[layer], self.values[layer]


def attention_forward(attn: Attention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      cache: KVCache | None, layer: int) -> torch.Tensor:
    """Self-attention of ``x`` ``[B, L, H]`` (positions after the cache's), appending to ``cache``."""
    batch, length, _ = x.shape
    shape = (batch, length, -1, attn.head_dim)
    eps = attn.q_norm.variance_epsilon
    q = rms_norm(attn.q_proj(x).view(shape), attn.q_norm.weight, eps).transpose(1, 2)
    k = rms_norm(attn.k_proj(x).view(shape), attn.k_norm.weight, attn.k_norm.variance_epsilon).transpose(1, 2)
    v = attn.v_proj(x).view(shape).transpose(1, 2)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q = (q * cos) + (rotate_half(q) * sin)
    k = (k * cos) + (rotate_half(k) * sin)
    if cache is not None:
        k, v = cache.update(layer, k, v)
    extra = {"enable_gqa": True} if attn.num_heads != attn.num_kv_heads else {}
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, scale=attn.scaling,
                                         is_causal=length > 1, **extra)
    out = out.transpose(1, 2).contiguous().reshape(batch, length, -1)
    return attn.o_proj(out)


def mlp_forward(mlp: MLP, x: torch.Tensor) -> torch.Tensor:
    return mlp.down_proj(mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x))


class MoeDecoderLayer(nn.Module):
    """One thinker or talker layer: attention, then a sparse MoE block or a dense MLP."""

    def __init__(self, config: MoeTextConfig, layer: int) -> None:
        super().__init__()
        c = config
        self.self_attn = Attention(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                                   c.rms_norm_eps, c.attention_bias)
        if c.is_sparse(layer):
            self.mlp: nn.Module = SparseMoeBlock(c.hidden_size, c.moe_intermediate_size, c.num_experts,
                                                 c.num_experts_per_tok, c.norm_topk_prob, c.hidden_act,
                                                 c.shared_expert_intermediate_size)
        else:
            self.mlp = MLP(c.hidden_size, c.intermediate_size, c.hidden_act)
        self.input_layernorm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.layer = layer

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: KVCache | None) -> torch.Tensor:
        norm = self.input_layernorm
        hidden = hidden + attention_forward(self.self_attn, rms_norm(hidden, norm.weight, norm.variance_epsilon),
                                            cos, sin, cache, self.layer)
        norm = self.post_attention_layernorm
        x = rms_norm(hidden, norm.weight, norm.variance_epsilon)
        mlp = self.mlp
        return hidden + (mlp(x) if isinstance(mlp, SparseMoeBlock) else mlp_forward(mlp, x))
