"""Qwen3 decoder building blocks: the modules that hold a decoder layer's checkpoint tensors
(Qwen3-TTS's talker and code predictor, Qwen3-Omni's thinker, talker and code predictor).

Attribute names equal the checkpoint's (``self_attn.q_proj``, ``mlp.gate_proj``,
``input_layernorm`` ...), so ``model.safetensors`` loads unchanged. The modules only hold
weights: each family writes the arithmetic over them in its reference's operation order and
shapes (on CPU the bits of a matmul depend on the shape it runs in).
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
    """``weight * x / sqrt(mean(x^2) + eps)``, computed in float32 by the family's arithmetic."""

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
