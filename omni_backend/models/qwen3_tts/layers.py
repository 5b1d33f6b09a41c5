"""Qwen3 decoder building blocks shared by the talker and the code predictor: the modules that
hold the checkpoint's tensors, and the rotary tables.

Attribute names equal the checkpoint's (``self_attn.q_proj``, ``mlp.gate_proj``,
``input_layernorm`` ...), so ``model.safetensors`` loads unchanged. The modules only hold
weights: the arithmetic over them, prefill and decode, is :mod:`.decode` (written once, for both
engine paths).

The rotary tables reproduce the reference's bits (``qwen-tts==0.1.1`` on transformers 4.57.3):
on CPU the bits of ``cos`` depend on the shape it is computed in, so decode positions are
computed one at a time, in the reference's decode shape (:class:`TalkerRotary`,
:class:`CodePredictorRotary`).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "RMSNorm",
    "MLP",
    "Attention",
    "DecoderLayer",
    "TalkerRotary",
    "CodePredictorRotary",
    "activation",
]

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"silu": F.silu}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"hidden_act {name!r} is not supported (known: {', '.join(_ACTIVATIONS)})") from None


# --------------------------------------------------------------------------- norms and MLP


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x^2) + eps)``, computed in float32 (:mod:`.decode`)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps


class MLP(nn.Module):
    """SwiGLU feed-forward: ``down(act(gate(x)) * up(x))``."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.hidden_act = hidden_act
        self.act_fn = activation(hidden_act)


# --------------------------------------------------------------------------- rotary embeddings


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
        """cos/sin ``[1, 1, length, D]`` of positions ``0..length-1``."""
        return self._compute(torch.arange(length, device=self.device))

    def table(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[length, D]`` of positions ``0..length-1`` computed in one tensor (the prefill
        shape): the static step's table, which indexes it on the device."""
        cos, sin = self.prefill(length)
        return cos[0, 0], sin[0, 0]

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


class DecoderLayer(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 rms_norm_eps: float, hidden_act: str, attention_bias: bool = False) -> None:
        super().__init__()
        self.self_attn = Attention(hidden_size, num_heads, num_kv_heads, head_dim, rms_norm_eps, attention_bias)
        self.mlp = MLP(hidden_size, intermediate_size, hidden_act)
        self.input_layernorm = RMSNorm(hidden_size, eps=rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps=rms_norm_eps)
