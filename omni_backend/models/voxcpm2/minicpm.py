"""MiniCPM4: the transformer stack of VoxCPM2's backbone, residual LM, local encoder and local
diffusion transformer. Module names are the checkpoint's (``layers.{i}.self_attn.q_proj``, ...).

Two paths, as the reference's: ``forward`` over a whole sequence (prefill, and the local stacks'
bidirectional passes) and ``forward_step``, one new position per row against a static KV cache.
``forward_step`` is batched: each row has its own cache slot and position (the reference's runs one
sequence), with the same arithmetic per row (rope in float32, attention over the cached positions
up to the row's own).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .config import MiniCPM4Config


def rms_layernorm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    old_dtype = hidden.dtype
    variance = hidden.to(torch.float32).pow(2).mean(dim=-1, keepdim=True)
    hidden = (hidden * torch.rsqrt(variance + eps)).to(old_dtype)
    return hidden * weight


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return rms_layernorm(hidden, self.weight, self.variance_epsilon)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    dtype = q.dtype
    q, k = q.to(torch.float32), k.to(torch.float32)
    return ((q * cos) + (_rotate_half(q) * sin)).to(dtype), ((k * cos) + (_rotate_half(k) * sin)).to(dtype)


class LongRoPE(nn.Module):
    """MiniCPM's LongRoPE table (cos / sin per position, scaled), computed as the reference does:
    in float32, then cast to the model's dtype with the model."""

    def __init__(self, config: MiniCPM4Config):
        super().__init__()
        dim = config.head_dim
        scaling = config.rope_scaling
        scale = config.max_position_embeddings / scaling.original_max_position_embeddings
        factor = math.sqrt(1 + math.log(scale) / math.log(scaling.original_max_position_embeddings))
        inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2).float() / dim))
        t = torch.arange(config.max_position_embeddings, dtype=torch.float32)
        ext = scaling.long_factor if config.max_position_embeddings > scaling.original_max_position_embeddings \
            else scaling.short_factor
        freqs = torch.mul(torch.outer(t, 1.0 / torch.tensor(ext, dtype=torch.float32)), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos() * factor, persistent=False)
        self.register_buffer("sin_cached", emb.sin() * factor, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos_cached[positions], self.sin_cached[positions]


class Attention(nn.Module):
    def __init__(self, config: MiniCPM4Config):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        h = config.hidden_size
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=False)

    def forward(self, x: torch.Tensor, rope, is_causal: bool):
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = apply_rope(q, k, *rope)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)
        out = out.transpose(1, 2).contiguous().reshape(b, n, self.num_heads * self.head_dim)
        return self.o_proj(out), (k, v)

    def forward_step(self, x: torch.Tensor, rope, positions: torch.Tensor, slots: torch.Tensor,
                     k_cache: torch.Tensor, v_cache: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x [B, H]; positions / slots [B]; caches [slots, kv_heads, L, head_dim]; mask [B, 1, 1, L]."""
        b = x.shape[0]
        q = self.q_proj(x).view(b, 1, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, 1, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, 1, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            cos, sin = rope
            q, k = apply_rope(q, k, cos[:, None, None, :], sin[:, None, None, :])
        k_cache[slots, :, positions, :] = k[:, :, 0, :]
        v_cache[slots, :, positions, :] = v[:, :, 0, :]
        keys, values = k_cache[slots], v_cache[slots]
        out = nn.functional.scaled_dot_product_attention(q.contiguous(), keys, values, attn_mask=mask,
                                                         enable_gqa=True)
        out = out.transpose(1, 2).contiguous().reshape(b, self.num_heads * self.head_dim)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, config: MiniCPM4Config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: MiniCPM4Config):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.residual_scale = config.scale_depth / math.sqrt(config.num_hidden_layers) if config.use_mup else None

    def _add(self, residual: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return residual + h * self.residual_scale if self.residual_scale is not None else residual + h

    def forward(self, x: torch.Tensor, rope, is_causal: bool):
        h, kv = self.self_attn(self.input_layernorm(x), rope, is_causal)
        x = self._add(x, h)
        return self._add(x, self.mlp(self.post_attention_layernorm(x))), kv

    def forward_step(self, x, rope, positions, slots, k_cache, v_cache, mask) -> torch.Tensor:
        x = self._add(x, self.self_attn.forward_step(self.input_layernorm(x), rope, positions, slots,
                                                     k_cache, v_cache, mask))
        return self._add(x, self.mlp(self.post_attention_layernorm(x)))


class MiniCPMModel(nn.Module):
    def __init__(self, config: MiniCPM4Config):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size) if config.vocab_size > 0 \
            else nn.Identity()
        self.layers = nn.ModuleList([DecoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rope_emb = None if config.no_rope else LongRoPE(config)

    def forward(self, inputs_embeds: torch.Tensor, is_causal: bool = True):
        """[B, N, H] -> (hidden [B, N, H], per layer (k, v) [B, kv_heads, N, head_dim])."""
        rope = None
        if self.rope_emb is not None:
            rope = self.rope_emb(torch.arange(inputs_embeds.size(1), device=inputs_embeds.device))
        x, caches = inputs_embeds, []
        for layer in self.layers:
            x, kv = layer(x, rope, is_causal)
            caches.append(kv)
        return self.norm(x), caches

    def forward_step(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                     cache: "StaticKVCache") -> torch.Tensor:
        """One new position per row: [B, H] at ``positions`` in cache ``slots`` -> [B, H]."""
        rope = self.rope_emb(positions) if self.rope_emb is not None else None
        mask = (torch.arange(cache.max_length, device=positions.device)[None, :] <= positions[:, None])
        mask = mask[:, None, None, :]
        x = inputs_embeds
        for i, layer in enumerate(self.layers):
            x = layer.forward_step(x, rope, positions, slots, cache.k[i], cache.v[i], mask)
        return self.norm(x)


class StaticKVCache:
    """Per layer K and V of ``slots`` sequences, ``max_length`` positions each."""

    def __init__(self, config: MiniCPM4Config, slots: int, max_length: int, device, dtype: torch.dtype):
        shape = (config.num_hidden_layers, slots, config.num_key_value_heads, max_length, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_length = max_length

    def fill(self, slot: int, caches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Store a prefill's (k, v) per layer (batch 1) at positions 0.. of ``slot``; clear the rest."""
        n = caches[0][0].size(2)
        self.k[:, slot].zero_()
        self.v[:, slot].zero_()
        for i, (k, v) in enumerate(caches):
            self.k[i, slot, :, :n] = k[0]
            self.v[i, slot, :, :n] = v[0]
