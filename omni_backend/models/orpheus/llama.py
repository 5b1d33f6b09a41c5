"""The Llama decoder that Orpheus is, for the torch engine (the vLLM engine runs its own).

Attribute names equal the Hugging Face checkpoint's (``model.layers.{i}.self_attn.q_proj``,
``model.norm``, ``lm_head``), so ``model.safetensors`` loads unchanged. The arithmetic follows
transformers' ``LlamaForCausalLM`` in its shapes: a prompt is one ``[1, L]`` forward, each later
token a ``[1, 1]`` forward over the cached keys, rotary tables computed per call shape (on CPU
their bits depend on it), RMSNorm in float32; logits are float32.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omni_backend.engine import StaticKVCache

__all__ = ["LlamaConfig", "LlamaForCausalLM", "load_llama", "rope_inv_freq"]


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LlamaConfig":
        if d.get("model_type", "llama") != "llama":
            raise ValueError(f"config.json: model_type {d.get('model_type')!r} is not llama")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json: hidden_act {d.get('hidden_act')!r} is not supported (silu)")
        if d.get("attention_bias") or d.get("mlp_bias"):
            raise ValueError("config.json: attention_bias / mlp_bias are not supported")
        heads = int(d["num_attention_heads"])
        eos = d.get("eos_token_id")
        eos = () if eos is None else tuple(eos) if isinstance(eos, list) else (int(eos),)
        scaling = d.get("rope_scaling")
        theta = d.get("rope_theta")
        # transformers 5 saves both in one `rope_parameters` (a fine-tune re-saved with it)
        params = d.get("rope_parameters")
        if isinstance(params, dict):
            theta = params.get("rope_theta", theta)
            if scaling is None:
                scaling = dict(params)
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind not in ("llama3", "default"):
                raise ValueError(f"config.json: rope_scaling type {kind!r} is not supported (llama3)")
            if kind == "default":
                scaling = None
        return cls(vocab_size=int(d["vocab_size"]), hidden_size=int(d["hidden_size"]),
                   intermediate_size=int(d["intermediate_size"]), num_hidden_layers=int(d["num_hidden_layers"]),
                   num_attention_heads=heads, num_key_value_heads=int(d.get("num_key_value_heads") or heads),
                   head_dim=int(d.get("head_dim") or d["hidden_size"] // heads),
                   rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)), rope_theta=float(10000.0 if theta is None else theta),
                   rope_scaling=scaling, max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
                   tie_word_embeddings=bool(d.get("tie_word_embeddings", False)), eos_token_ids=eos)


def rope_inv_freq(config: LlamaConfig) -> torch.Tensor:
    """Inverse frequencies as transformers computes them (default, or Llama 3's scaled ones)."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
    s = config.rope_scaling
    if s is None:
        return inv_freq
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_context = float(s["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=False)


class MLP(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class LlamaModel(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaForCausalLM(nn.Module):
    """Weights plus the two forwards the runner needs, both over a :class:`StaticKVCache`."""

    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.config = c
        self.model = LlamaModel(c)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_inv_freq(c), persistent=False)
        self._decode_rope: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[1, 1, L, D]`` for ``positions`` ``[L]``, in transformers' arithmetic."""
        position_ids = positions.view(1, -1)
        inv = self.inv_freq[None, :, None].float().expand(1, -1, 1)
        freqs = (inv.float() @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]

    def _rope_at(self, position: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode position, computed alone (the reference's decode shape), cached."""
        table = self._decode_rope.get(position)
        if table is None:
            table = self._rope(torch.tensor([position], device=self.inv_freq.device), dtype)
            self._decode_rope[position] = table
        return table

    def _layer(self, i: int, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: StaticKVCache,
               slot: int, start: int) -> torch.Tensor:
        """One layer for one sequence: ``h`` [1, L, H] at cache positions ``start..start+L-1``."""
        layer = self.model.layers[i]
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        length = x.shape[1]
        q = attn.q_proj(x).view(1, length, attn.num_heads, attn.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(1, length, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(1, length, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        cache.keys[i][slot, :, start:start + length].copy_(k[0])
        cache.values[i][slot, :, start:start + length].copy_(v[0])
        keys, values = cache.view(i, slot, start + length)
        groups = attn.num_heads // attn.num_kv_heads
        if groups > 1:
            keys = keys.repeat_interleave(groups, dim=1)
            values = values.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, keys, values, is_causal=length > 1,
                                             scale=attn.head_dim ** -0.5)
        h = h + attn.o_proj(out.transpose(1, 2).reshape(1, length, -1))
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def forward_one(self, ids: torch.Tensor, cache: StaticKVCache, slot: int, start: int) -> torch.Tensor:
        """Run ``ids`` [L] of one sequence from cache position ``start``; float32 logits of the
        last position, ``[1, vocab]``."""
        h = self.model.embed_tokens(ids.view(1, -1))
        if ids.numel() == 1:
            cos, sin = self._rope_at(start, h.dtype)
        else:
            cos, sin = self._rope(torch.arange(start, start + ids.numel(), device=ids.device), h.dtype)
        for i in range(len(self.model.layers)):
            h = self._layer(i, h, cos, sin, cache, slot, start)
        h = self.model.norm(h[:, -1:])
        return self.lm_head(h)[:, -1].float()


def load_llama(path: str, dtype: torch.dtype = torch.float32, device: str = "cpu") -> LlamaForCausalLM:
    """``config.json`` + ``model.safetensors`` (or shards listed in ``model.safetensors.index.json``)."""
    from safetensors.torch import load_file

    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        config = LlamaConfig.from_dict(json.load(f))
    files = ["model.safetensors"]
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(os.path.join(path, name)))
    if config.tie_word_embeddings:
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    missing = set(model.state_dict()) - set(state)
    unexpected = set(state) - set(model.state_dict()) - {k for k in state if k.endswith("rotary_emb.inv_freq")}
    if missing or unexpected:
        raise ValueError(f"{path}: checkpoint does not match config.json (missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]})")
    model.load_state_dict({k: v.to(dtype) for k, v in state.items() if k in model.state_dict()},
                          strict=True, assign=True)
    model.inv_freq = rope_inv_freq(config)
    return model.to(device).eval()
