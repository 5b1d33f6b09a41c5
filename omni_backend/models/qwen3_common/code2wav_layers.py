"""Building blocks of the Qwen3 12 Hz codec decoders ("code2wav"): Qwen3-TTS's speech-tokenizer
decoder and Qwen3-Omni's ``code2wav`` (same modules and keys but for the input stage and how the
transposed convolutions trim).

Every module here keeps the attribute names of the released checkpoints, so the
``decoder.*`` tensors of ``speech_tokenizer/model.safetensors`` load unchanged into
:class:`~omni_backend.models.qwen3_tts.code2wav.Code2Wav` (with the ``decoder.`` prefix
removed), and the ``code2wav.*`` tensors into
:class:`~omni_backend.models.qwen3_omni.code2wav.Code2Wav`. The maths follows the reference
package ``qwen-tts==0.1.1`` operation for operation; everything runs in Float32.

Everything is causal in time: output position ``t`` depends only on inputs ``<= t``. That is
what makes the stateless windows of the streaming contract work, and what lets a batch of
windows of different lengths be right-padded (the padding sits in the "future" of every real
frame, so it cannot change them).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "CausalConv1d",
    "CausalTransposedConv1d",
    "SnakeBeta",
    "ConvNeXtBlock",
    "ResidualUnit",
    "DecoderBlock",
    "vocoder",
    "SplitResidualVectorQuantizer",
    "SlidingWindowTransformer",
    "causal_history_frames",
]


# --------------------------------------------------------------------------- convolutions


class CausalConv1d(nn.Module):
    """Stride-1 Conv1d fed ``(kernel_size - 1) * dilation`` zeros on the left.

    The reference also computes a right padding for strided convolutions; every convolution
    of this decoder has stride 1, for which that padding is always zero.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1,
                 groups: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, groups=groups)
        self.left_padding = (kernel_size - 1) * dilation

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.left_padding:
            hidden = F.pad(hidden, (self.left_padding, 0))
        return self.conv(hidden)


class CausalTransposedConv1d(nn.Module):
    """ConvTranspose1d whose last ``kernel_size - stride`` samples are dropped.

    ``T`` input steps give exactly ``T * stride`` output samples, and output sample ``s``
    depends only on inputs ``<= s // stride``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.stride = stride
        self.right_trim = kernel_size - stride
        # output sample s reads inputs s // stride - history .. s // stride
        self.history = (kernel_size - 1) // stride

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = self.conv(hidden)
        if self.right_trim:
            hidden = hidden[..., : hidden.shape[-1] - self.right_trim]
        return hidden


# --------------------------------------------------------------------------- activations / blocks


class SnakeBeta(nn.Module):
    """``x + 1 / (exp(beta) + 1e-9) * sin(x * exp(alpha)) ** 2`` per channel.

    ``alpha`` and ``beta`` are stored in log space, shape ``[channels]``; input ``[B, C, T]``.
    """

    no_div_by_zero = 1e-9

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        alpha = torch.exp(self.alpha)[None, :, None]
        beta = torch.exp(self.beta)[None, :, None]
        return hidden + (1.0 / (beta + self.no_div_by_zero)) * torch.sin(hidden * alpha).pow(2)


class ConvNeXtBlock(nn.Module):
    """Causal depthwise conv (k=7) -> LayerNorm -> Linear x4 -> GELU -> Linear -> gamma, residual."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, kernel_size=7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        branch = self.dwconv(hidden).permute(0, 2, 1)
        branch = self.pwconv2(self.act(self.pwconv1(self.norm(branch))))
        branch = (self.gamma * branch).permute(0, 2, 1)
        return hidden + branch


class ResidualUnit(nn.Module):
    """SnakeBeta -> causal conv k=7 (dilated) -> SnakeBeta -> conv k=1, plus the input."""

    def __init__(self, dim: int, dilation: int) -> None:
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, kernel_size=7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, kernel_size=1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        branch = self.conv2(self.act2(self.conv1(self.act1(hidden))))
        return branch + hidden


class DecoderBlock(nn.Module):
    """SnakeBeta, transposed conv (kernel 2*rate, stride rate), residual units with dilations 1/3/9.

    Checkpoint layout: ``block.0`` SnakeBeta, ``block.1`` the transposed conv, ``block.2..4``
    the residual units.
    """

    residual_dilations = (1, 3, 9)

    def __init__(self, in_dim: int, out_dim: int, upsample_rate: int,
                 transposed: Callable[[int, int, int, int], nn.Module] = CausalTransposedConv1d) -> None:
        super().__init__()
        layers: list[nn.Module] = [SnakeBeta(in_dim), transposed(in_dim, out_dim, 2 * upsample_rate, upsample_rate)]
        layers += [ResidualUnit(out_dim, dilation) for dilation in self.residual_dilations]
        self.block = nn.ModuleList(layers)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        for layer in self.block:
            hidden = layer(hidden)
        return hidden


def vocoder(input_dim: int, decoder_dim: int, upsampling_ratios: Iterable[int], upsample_rates: Iterable[int],
            transposed: Callable[[int, int, int, int], nn.Module] = CausalTransposedConv1d
            ) -> tuple[nn.ModuleList, nn.ModuleList]:
    """What follows the decoder's transformer, under the checkpoint's keys: ``upsample`` (per ratio,
    a transposed conv with kernel = stride = ratio, then a ConvNeXt block) and ``decoder`` (conv
    k=7, one :class:`DecoderBlock` per rate halving the channels, SnakeBeta, conv k=7 to one
    channel). ``transposed(in, out, kernel, stride)`` makes the transposed convolutions: the
    families trim their overhang differently."""
    upsample = nn.ModuleList([nn.ModuleList([transposed(input_dim, input_dim, ratio, ratio), ConvNeXtBlock(input_dim)])
                              for ratio in upsampling_ratios])
    stages: list[nn.Module] = [CausalConv1d(input_dim, decoder_dim, kernel_size=7)]
    rates = tuple(upsample_rates)
    for index, rate in enumerate(rates):
        stages.append(DecoderBlock(decoder_dim // 2 ** index, decoder_dim // 2 ** (index + 1), rate, transposed))
    output_dim = decoder_dim // 2 ** len(rates)
    stages += [SnakeBeta(output_dim), CausalConv1d(output_dim, 1, kernel_size=7)]
    return upsample, nn.ModuleList(stages)


# --------------------------------------------------------------------------- RVQ dequantisation


class Codebook(nn.Module):
    """One codebook stored as running sums: entry ``i`` is ``embedding_sum[i] / max(cluster_usage[i], eps)``."""

    epsilon = 1e-5

    def __init__(self, dim: int, codebook_size: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(codebook_size))
        self.embedding_sum = nn.Parameter(torch.zeros(codebook_size, dim))

    def lookup(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes [B, T]`` -> ``[B, T, dim]``. Gathers first, then divides: the same numbers as
        normalising the whole table first, at a fraction of the work."""
        usage = self.cluster_usage.clamp(min=self.epsilon)
        return F.embedding(codes, self.embedding_sum) / F.embedding(codes, usage[:, None])


class CodebookLayer(nn.Module):
    """A vector-quantisation layer; only its codebook carries weights (``_codebook.*``)."""

    def __init__(self, dim: int, codebook_size: int) -> None:
        super().__init__()
        self._codebook = Codebook(dim, codebook_size)


class CodebookStack(nn.Module):
    def __init__(self, num_codebooks: int, dim: int, codebook_size: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([CodebookLayer(dim, codebook_size) for _ in range(num_codebooks)])


class ResidualVectorQuantizer(nn.Module):
    """Sum of the codebook entries of several codebooks, then a 1x1 projection (no bias).

    ``input_proj`` belongs to the encoding direction; it is kept only so that the checkpoint
    loads strictly.
    """

    def __init__(self, num_codebooks: int, dim: int, outer_dim: int, codebook_size: int) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(outer_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, outer_dim, 1, bias=False)
        self.vq = CodebookStack(num_codebooks, dim, codebook_size)

    def dequantize(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes [B, K, T]`` -> ``[B, outer_dim, T]``."""
        summed = None
        for index, layer in enumerate(self.vq.layers):
            entry = layer._codebook.lookup(codes[:, index])
            summed = entry if summed is None else summed + entry
        return self.output_proj(summed.transpose(1, 2))


class SplitResidualVectorQuantizer(nn.Module):
    """Codebook 0 (semantic) through ``rvq_first``, codebooks 1.. (acoustic) through ``rvq_rest``;
    the two projected sums are added."""

    def __init__(self, num_quantizers: int, num_semantic_quantizers: int, codebook_dim: int,
                 codebook_size: int) -> None:
        super().__init__()
        if num_quantizers <= num_semantic_quantizers:
            raise ValueError("num_quantizers must exceed num_semantic_quantizers")
        dim = codebook_dim // 2
        self.num_semantic_quantizers = num_semantic_quantizers
        self.rvq_first = ResidualVectorQuantizer(num_semantic_quantizers, dim, codebook_dim, codebook_size)
        self.rvq_rest = ResidualVectorQuantizer(num_quantizers - num_semantic_quantizers, dim, codebook_dim,
                                                codebook_size)

    def dequantize(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes [B, num_quantizers, T]`` -> ``[B, codebook_dim, T]``."""
        semantic = self.rvq_first.dequantize(codes[:, : self.num_semantic_quantizers])
        return semantic + self.rvq_rest.dequantize(codes[:, self.num_semantic_quantizers:])


# --------------------------------------------------------------------------- transformer

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "relu": F.relu,
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        variance = hidden.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden * torch.rsqrt(variance + self.eps))


class LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.scale * hidden


class GatedMlp(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str) -> None:
        super().__init__()
        if hidden_act not in _ACTIVATIONS:
            raise ValueError(f"unsupported hidden_act {hidden_act!r}; known: {sorted(_ACTIVATIONS)}")
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.act_fn = _ACTIVATIONS[hidden_act]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(hidden)) * self.up_proj(hidden))


def rotate_half(hidden: torch.Tensor) -> torch.Tensor:
    half = hidden.shape[-1] // 2
    return torch.cat((-hidden[..., half:], hidden[..., :half]), dim=-1)


class SlidingWindowAttention(nn.Module):
    """Causal self-attention over the last ``sliding_window`` positions (the query's own included),
    rotary positions (half-split), grouped key/value heads."""

    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, bias: bool) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scaling = head_dim ** -0.5
        self.q_proj = nn.Linear(hidden_size, num_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden_size, bias=bias)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                allowed: torch.Tensor) -> torch.Tensor:
        batch, length, _ = hidden.shape
        q = self.q_proj(hidden).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:  # query head h reads key/value head h // groups
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=self.scaling)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim))


class TransformerLayer(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int, intermediate_size: int,
                 hidden_act: str, rms_norm_eps: float, attention_bias: bool) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hidden_size, rms_norm_eps)
        self.self_attn = SlidingWindowAttention(hidden_size, num_heads, num_kv_heads, head_dim, attention_bias)
        self.self_attn_layer_scale = LayerScale(hidden_size)
        self.post_attention_layernorm = RMSNorm(hidden_size, rms_norm_eps)
        self.mlp = GatedMlp(hidden_size, intermediate_size, hidden_act)
        self.mlp_layer_scale = LayerScale(hidden_size)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                allowed: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(hidden), cos, sin, allowed))
        return hidden + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(hidden)))


class SlidingWindowTransformer(nn.Module):
    """``input_proj`` (latent -> hidden), sliding-window causal layers, RMSNorm, ``output_proj``.

    Positions restart at 0 for every call (window), exactly like the reference's chunked decode.
    """

    def __init__(self, *, latent_dim: int, hidden_size: int, num_hidden_layers: int, num_attention_heads: int,
                 num_key_value_heads: int, head_dim: int, intermediate_size: int, hidden_act: str,
                 rms_norm_eps: float, rope_theta: float, sliding_window: int, attention_bias: bool) -> None:
        super().__init__()
        self.sliding_window = sliding_window
        self.input_proj = nn.Linear(latent_dim, hidden_size)
        self.layers = nn.ModuleList([
            TransformerLayer(hidden_size, num_attention_heads, num_key_value_heads, head_dim, intermediate_size,
                             hidden_act, rms_norm_eps, attention_bias)
            for _ in range(num_hidden_layers)
        ])
        self.norm = RMSNorm(hidden_size, rms_norm_eps)
        self.output_proj = nn.Linear(hidden_size, latent_dim)
        self.head_dim = head_dim
        self.rope_theta = rope_theta

    def rotary(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[T, head_dim]`` for positions ``0..T-1`` (Float32)."""
        exponent = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).float() / self.head_dim
        inv_freq = 1.0 / (self.rope_theta ** exponent)
        positions = torch.arange(length, device=device, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos(), angles.sin()

    def allowed_positions(self, length: int, device: torch.device) -> torch.Tensor:
        """``[T, T]`` bool, True where query ``q`` may read key ``k``: ``q - window < k <= q``."""
        query = torch.arange(length, device=device)[:, None]
        key = torch.arange(length, device=device)[None, :]
        return (key <= query) & (key > query - self.sliding_window)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[B, T, latent]`` -> ``[B, T, latent]``."""
        hidden = self.input_proj(hidden)
        length = hidden.shape[1]
        cos, sin = self.rotary(length, hidden.device)
        allowed = self.allowed_positions(length, hidden.device)
        for layer in self.layers:
            hidden = layer(hidden, cos, sin, allowed)
        return self.output_proj(self.norm(hidden))


def total_upsampling(rates) -> int:
    return int(math.prod(int(r) for r in rates))


# --------------------------------------------------------------------------- receptive field


def causal_history_frames(layers: Iterable[nn.Module], steps_per_frame: int = 1) -> tuple[Fraction, int]:
    """How far into the past (in codec frames) the output of ``layers``, applied in order to an
    input of ``steps_per_frame`` steps per frame, can look; and the steps per frame after them.

    An upper bound, exact for these causal layers: output at frame ``t`` depends on inputs in
    ``(t - history, t]`` only.
    """
    history = Fraction(0)
    rate = steps_per_frame
    for layer in layers:
        if isinstance(layer, CausalConv1d):
            history += Fraction(layer.left_padding, rate)
        elif isinstance(layer, CausalTransposedConv1d):
            history += Fraction(layer.history, rate)
            rate *= layer.stride
        elif isinstance(layer, ConvNeXtBlock):
            history += Fraction(layer.dwconv.left_padding, rate)
        elif isinstance(layer, ResidualUnit):
            history += Fraction(layer.conv1.left_padding + layer.conv2.left_padding, rate)
        elif isinstance(layer, DecoderBlock):
            inner, rate = causal_history_frames(layer.block, rate)
            history += inner
        elif isinstance(layer, nn.ModuleList):
            inner, rate = causal_history_frames(layer, rate)
            history += inner
        elif not isinstance(layer, SnakeBeta):
            raise TypeError(f"unknown layer {type(layer).__name__}")
    return history, rate
