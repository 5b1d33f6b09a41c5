"""Qwen3-Omni's codec decoder (checkpoint prefix ``code2wav.``): G codebooks per 12.5 Hz frame ->
24 kHz audio, always in Float32.

Pipeline (the reference ``Qwen3OmniMoeCode2Wav``)::

    codes [B, G, T]
      -> code_embedding(codes + g * codebook_size), mean over the G codebooks   [B, T, hidden]
      -> pre_transformer (sliding-window causal attention, RoPE from 0)         [B, T, hidden]
      -> upsample: per ratio, a transposed conv + a ConvNeXt block              [B, hidden, 4T]
      -> decoder: conv k=7, one block per upsample rate, SnakeBeta, conv k=7    [B, 1, samples]
      -> clamp to [-1, 1]

The convolutions, ConvNeXt blocks, SnakeBeta, residual units, transformer layers and the
assembly after the transformer are the Qwen3 codec-decoder modules Qwen3-TTS uses too
(:mod:`omni_backend.models.qwen3_common.code2wav_layers`: same maths, same checkpoint keys).
Two pieces differ from Qwen3-TTS's decoder: there is no RVQ / ``pre_conv`` / transformer in-out
projection, and the transposed convolutions (:class:`TrimmedTransposedConv1d`, defined here)
drop ``kernel - stride`` samples at BOTH ends (Qwen3-TTS: the right end only). So a decoder
block with rate ``r`` turns ``n`` steps into ``(n - 1) * r`` samples, and a decode of ``T``
frames yields ``T * hop_length - trim`` samples (``trim`` = 555 with the released
rates): the reference's :meth:`Code2Wav.chunked_decode` (chunks of 300 frames with 25 frames of
left context) therefore loses ``trim`` samples at the end of every chunk, and so does a streamed
window.

Stateless windows: :meth:`Code2Wav.decode_window` decodes ``left_context + new`` frames and
keeps the audio after the first ``left_context * hop_length`` samples, exactly what
``chunked_decode`` does per chunk; concatenating the windows of the chunk plan
``(chunk_size, left_context_size)`` reproduces ``chunked_decode``.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from omni_backend.models.qwen3_common.code2wav_layers import RMSNorm, TransformerLayer, vocoder

from .config import Code2WavConfig

__all__ = [
    "Code2Wav",
    "Code2WavTransformer",
    "TrimmedTransposedConv1d",
    "REFERENCE_CHUNK_FRAMES",
    "REFERENCE_LEFT_CONTEXT_FRAMES",
]

# the reference generate() decodes with chunked_decode(codes, chunk_size=300, left_context_size=25)
REFERENCE_CHUNK_FRAMES = 300
REFERENCE_LEFT_CONTEXT_FRAMES = 25


class TrimmedTransposedConv1d(nn.Module):
    """ConvTranspose1d with ``kernel - stride`` samples dropped at each end (key ``conv``)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.trim = math.ceil(kernel_size - stride)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = self.conv(hidden)
        return hidden[..., self.trim: hidden.shape[-1] - self.trim].contiguous()


class Code2WavTransformer(nn.Module):
    """``pre_transformer``: sliding-window causal layers and a final RMSNorm, positions from 0."""

    def __init__(self, config: Code2WavConfig) -> None:
        super().__init__()
        c = config
        self.layers = nn.ModuleList([
            TransformerLayer(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                             c.intermediate_size, c.hidden_act, c.rms_norm_eps, c.attention_bias)
            for _ in range(c.num_hidden_layers)
        ])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.head_dim = c.head_dim
        self.rope_theta = c.rope_theta
        self.sliding_window = c.sliding_window

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[B, T, hidden]`` -> ``[B, T, hidden]``."""
        length, device = hidden.shape[1], hidden.device
        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float, device=device)
                                              / self.head_dim))
        freqs = torch.arange(length, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        query = torch.arange(length, device=device)[:, None]
        key = torch.arange(length, device=device)[None, :]
        allowed = (key <= query) & (key > query - self.sliding_window)
        for layer in self.layers:
            hidden = layer(hidden, angles.cos(), angles.sin(), allowed)
        return self.norm(hidden)


class Code2Wav(nn.Module):
    """Checkpoint prefix ``code2wav.``."""

    def __init__(self, config: Code2WavConfig) -> None:
        super().__init__()
        c = config
        self.config = c
        self.code_embedding = nn.Embedding(c.codebook_size * c.num_quantizers, c.hidden_size)
        self.register_buffer("code_offset", torch.arange(c.num_quantizers).view(1, -1, 1) * c.codebook_size,
                             persistent=False)
        self.pre_transformer = Code2WavTransformer(c)
        self.upsample, self.decoder = vocoder(c.hidden_size, c.decoder_dim, c.upsampling_ratios, c.upsample_rates,
                                              TrimmedTransposedConv1d)

    @property
    def hop_length(self) -> int:
        return self.config.hop_length

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def num_quantizers(self) -> int:
        return self.config.num_quantizers

    @property
    def device(self) -> torch.device:
        return self.code_embedding.weight.device

    def output_samples(self, frames: int) -> int:
        """Samples one decode of ``frames`` frames yields (``frames * hop_length`` minus the trims)."""
        steps = frames
        for ratio in self.config.upsampling_ratios:
            steps *= ratio  # kernel == stride: nothing to trim
        for rate in self.config.upsample_rates:
            steps = max((steps - 1) * rate, 0)  # (n - 1) * r + 2r, less r at each end
        return steps

    def _check(self, codes: torch.Tensor) -> torch.Tensor:
        if codes.dim() != 3 or codes.shape[1] != self.num_quantizers:
            raise ValueError(f"codes must be [batch, {self.num_quantizers}, frames], got {tuple(codes.shape)}")
        if codes.dtype.is_floating_point or codes.dtype == torch.bool:
            raise ValueError(f"codes must be integers, got {codes.dtype}")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.config.codebook_size):
            raise ValueError(f"codes must lie in [0, {self.config.codebook_size})")
        if self.code_embedding.weight.dtype != torch.float32:
            raise TypeError("code2wav runs in Float32; do not cast it to another dtype")
        return codes.to(device=self.device, dtype=torch.long)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes`` ``[B, G, T]`` -> audio ``[B, 1, output_samples(T)]`` in [-1, 1]."""
        codes = self._check(codes)
        hidden = self.code_embedding(codes + self.code_offset).mean(1)
        hidden = self.pre_transformer(hidden).permute(0, 2, 1)
        for stage in self.upsample:
            for layer in stage:
                hidden = layer(hidden)
        for layer in self.decoder:
            hidden = layer(hidden)
        return hidden.clamp(min=-1.0, max=1.0)

    def decode_window(self, codes: torch.Tensor, left_context: int) -> torch.Tensor:
        """A stateless window: ``codes`` ``[B, G, left_context + new]`` -> the audio after the
        context, ``[B, output_samples(left_context + new) - left_context * hop_length]``."""
        if not 0 <= left_context < codes.shape[-1]:
            raise ValueError(f"left_context {left_context} must be below the window's {codes.shape[-1]} frames")
        return self(codes)[:, 0, left_context * self.hop_length:]

    def decode_lookahead_window(self, codes: torch.Tensor, left_context: int, lookahead: int) -> torch.Tensor:
        """A streamed window (omni_backend/models/qwen3_omni/codec_windows.py): ``codes``
        ``[B, G, left_context + new + lookahead]`` -> the new frames' audio, ``new * hop_length``
        samples, or without lookahead the decode's whole tail (``trim`` samples short)."""
        audio = self.decode_window(codes, left_context)
        if lookahead:
            audio = audio[:, :(codes.shape[-1] - left_context - lookahead) * self.hop_length]
        return audio

    def chunked_decode(self, codes: torch.Tensor, chunk_size: int = REFERENCE_CHUNK_FRAMES,
                       left_context_size: int = REFERENCE_LEFT_CONTEXT_FRAMES) -> torch.Tensor:
        """The reference's whole-utterance decode: ``codes`` ``[B, G, T]`` -> ``[B, samples]``,
        chunks of ``chunk_size`` frames, each decoded with up to ``left_context_size`` frames of
        left context (none for the first chunk, fewer while the stream is short)."""
        pieces = []
        start, total = 0, codes.shape[-1]
        while start < total:
            end = min(start + chunk_size, total)
            # the reference's rule, also for start <= left_context_size: all frames before start
            context = left_context_size if start - left_context_size > 0 else start
            pieces.append(self.decode_window(codes[..., start - context:end], context))
            start = end
        if not pieces:
            return torch.zeros(codes.shape[0], 0, device=self.device)
        return torch.cat(pieces, dim=-1)
