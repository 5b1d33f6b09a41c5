"""One decode position for many rows in one forward: the throughput mode's decoder stack.

The exact mode runs every sequence alone in the reference's shapes. Here the rows of an engine
step share each forward: the projections and norms run once over ``[B, 1, hidden]``, the sparse
MoE block routes all ``B`` tokens at once (each expert's grouped matmul runs once per step over
every row routed to it), and attention reads a static per-slot KV cache
(:class:`~omni_backend.engine.kv_cache.StaticKVCache`): row ``b`` writes its new key at
``positions[b]`` of its slot, then attends over the slot's first ``length`` positions with a mask
that hides what lies beyond its own position (``length`` = the batch's furthest position + 1).

A row's result differs from its solo forward only by floating-point order (the matmul and
attention shapes change with the batch), which the throughput-mode tests measure.

:func:`decode_rows` is graph-safe when ``length`` is a fixed bucket: no host reads, no shape that
depends on a tensor's value (the slot gather and the mask are tensor ops).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omni_backend.engine.kv_cache import StaticKVCache

from .layers import KVCache, MoeDecoderLayer, rotate_half, mlp_forward, rms_norm
from .moe import SparseMoeBlock

__all__ = ["decode_rows", "store_prefill", "slot_cache_for"]


def slot_cache_for(layers: nn.ModuleList, num_slots: int, max_len: int) -> StaticKVCache:
    """A static cache with one slot per engine row for a decoder's ``layers``."""
    attn = layers[0].self_attn
    weight = attn.k_proj.weight
    cache = StaticKVCache(len(layers), num_slots, attn.num_kv_heads, max_len, attn.head_dim, dtype=weight.dtype,
                          device=weight.device)
    # A row attends over the batch's longest length; the keys past its own are masked out, but a
    # masked weight of 0 times a NaN value is NaN: the buffers start as zeros, not as empty memory
    # (later they hold finite values of earlier requests)
    for buffer in cache.keys + cache.values:
        buffer.zero_()
    return cache


def store_prefill(cache: StaticKVCache, slot: int, prefill: KVCache) -> int:
    """Copy a solo prefill's keys and values into ``slot``; returns the positions written."""
    for layer, (k, v) in enumerate(zip(prefill.keys, prefill.values)):
        cache.write_prefix(layer, slot, k, v)
    return prefill.length


def _attention(layer: MoeDecoderLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               cache: StaticKVCache, index: int, slots: torch.Tensor, positions: torch.Tensor,
               mask: torch.Tensor, length: int) -> torch.Tensor:
    attn = layer.self_attn
    rows = x.shape[0]
    shape = (rows, 1, -1, attn.head_dim)
    q = rms_norm(attn.q_proj(x).view(shape), attn.q_norm.weight, attn.q_norm.variance_epsilon).transpose(1, 2)
    k = rms_norm(attn.k_proj(x).view(shape), attn.k_norm.weight, attn.k_norm.variance_epsilon).transpose(1, 2)
    v = attn.v_proj(x).view(shape).transpose(1, 2)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q = (q * cos) + (rotate_half(q) * sin)
    k = (k * cos) + (rotate_half(k) * sin)
    cache.write_rows(index, slots, positions, k, v)
    keys = cache.keys[index][slots, :, :length]          # [B, kv_heads, length, D]
    values = cache.values[index][slots, :, :length]
    extra = {"enable_gqa": True} if attn.num_heads != attn.num_kv_heads else {}
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, dropout_p=0.0, scale=attn.scaling,
                                         **extra)
    return attn.o_proj(out.transpose(1, 2).reshape(rows, 1, -1))


def decode_rows(layers: nn.ModuleList, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: StaticKVCache, slots: torch.Tensor, positions: torch.Tensor, length: int) -> torch.Tensor:
    """Run ``layers`` over one new position per row: ``hidden`` ``[B, 1, H]``, rotary ``cos`` /
    ``sin`` ``[B, 1, D]`` at each row's position, ``slots`` / ``positions`` ``[B]`` (long). Every
    position must be below ``length``. Returns the last layer's output ``[B, 1, H]`` (not normed)."""
    key_index = torch.arange(length, device=hidden.device).view(1, 1, 1, -1)
    mask = key_index <= positions.view(-1, 1, 1, 1)      # [B, 1, 1, length]: a row's own keys only
    for index, layer in enumerate(layers):
        norm = layer.input_layernorm
        x = rms_norm(hidden, norm.weight, norm.variance_epsilon)
        hidden = hidden + _attention(layer, x, cos, sin, cache, index, slots, positions, mask, length)
        norm = layer.post_attention_layernorm
        x = rms_norm(hidden, norm.weight, norm.variance_epsilon)
        mlp = layer.mlp
        hidden = hidden + (mlp(x) if isinstance(mlp, SparseMoeBlock) else mlp_forward(mlp, x))
    return hidden
