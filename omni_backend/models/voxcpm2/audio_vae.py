"""VoxCPM2's AudioVAE (``audiovae.safetensors``; ``voxcpm``'s ``audio_vae_v2``): a causal
convolutional encoder (audio at ``sample_rate`` -> latents, for reference recordings) and decoder
(latents -> audio at ``out_sample_rate``, conditioned on the output rate's bin). Module names are
the checkpoint's; weight-normed convolutions keep ``weight_g`` / ``weight_v``.

Every convolution is causal with a finite reach, so a window of latents decoded with
:func:`decoder_left_context` frames of left context gives the same samples for its new frames as
the whole sequence's decode: the serving stage decodes stateless windows.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .config import AudioVAEConfig


def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    shape = x.shape
    x = x.reshape(shape[0], shape[1], -1)
    x = x + (alpha + 1e-9).reciprocal() * torch.sin(alpha * x).pow(2)
    return x.reshape(shape)


class Snake1d(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return snake(x, self.alpha)


class CausalConv1d(nn.Module):
    """A weight-normed Conv1d padded on the left only (``2 * padding - output_padding`` samples)."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int, stride: int = 1, dilation: int = 1,
                 padding: int = 0, output_padding: int = 0, groups: int = 1, bias: bool = True):
        super().__init__()
        self.weight_g = nn.Parameter(torch.ones(c_out, 1, 1))
        self.weight_v = nn.Parameter(torch.zeros(c_out, c_in // groups, kernel_size))
        self.bias = nn.Parameter(torch.zeros(c_out)) if bias else None
        self.stride, self.dilation, self.groups = stride, dilation, groups
        self.left_pad = padding * 2 - output_padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = torch._weight_norm(self.weight_v, self.weight_g, 0)
        x = nn.functional.pad(x, (self.left_pad, 0))
        return nn.functional.conv1d(x, w, self.bias, self.stride, 0, self.dilation, self.groups)


class CausalTransposeConv1d(nn.Module):
    """A weight-normed ConvTranspose1d whose last ``2 * padding - output_padding`` samples are cut."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int, stride: int, padding: int, output_padding: int):
        super().__init__()
        self.weight_g = nn.Parameter(torch.ones(c_in, 1, 1))
        self.weight_v = nn.Parameter(torch.zeros(c_in, c_out, kernel_size))
        self.bias = nn.Parameter(torch.zeros(c_out))
        self.stride = stride
        self.trim = padding * 2 - output_padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = torch._weight_norm(self.weight_v, self.weight_g, 0)
        return nn.functional.conv_transpose1d(x, w, self.bias, self.stride)[..., :-self.trim]


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int, groups: int):
        super().__init__()
        pad = ((7 - 1) * dilation) // 2
        self.block = nn.Sequential(Snake1d(dim), CausalConv1d(dim, dim, 7, dilation=dilation, padding=pad,
                                                              groups=groups),
                                   Snake1d(dim), CausalConv1d(dim, dim, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class EncoderBlock(nn.Module):
    def __init__(self, output_dim: int, stride: int, groups: int):
        super().__init__()
        d = output_dim // 2
        self.block = nn.Sequential(
            ResidualUnit(d, 1, groups), ResidualUnit(d, 3, groups), ResidualUnit(d, 9, groups), Snake1d(d),
            CausalConv1d(d, output_dim, 2 * stride, stride=stride, padding=math.ceil(stride / 2),
                         output_padding=stride % 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class Encoder(nn.Module):
    def __init__(self, cfg: AudioVAEConfig):
        super().__init__()
        d = cfg.encoder_dim
        blocks: list[nn.Module] = [CausalConv1d(1, d, 7, padding=3)]
        for stride in cfg.encoder_rates:
            d *= 2
            blocks.append(EncoderBlock(d, stride, d // 2 if cfg.depthwise else 1))
        self.block = nn.Sequential(*blocks)
        self.fc_mu = CausalConv1d(d, cfg.latent_dim, 3, padding=1)
        self.fc_logvar = CausalConv1d(d, cfg.latent_dim, 3, padding=1)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        return self.fc_mu(self.block(audio))


class DecoderBlock(nn.Module):
    def __init__(self, input_dim: int, output_dim: int, stride: int, groups: int):
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(input_dim),
            CausalTransposeConv1d(input_dim, output_dim, 2 * stride, stride, math.ceil(stride / 2), stride % 2),
            ResidualUnit(output_dim, 1, groups), ResidualUnit(output_dim, 3, groups),
            ResidualUnit(output_dim, 9, groups))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class SampleRateCondition(nn.Module):
    """``scale_bias``: per output-rate bin, a scale and a bias per channel (the released kind)."""

    def __init__(self, dim: int, buckets: int):
        super().__init__()
        self.scale_embed = nn.Embedding(buckets, dim)
        self.bias_embed = nn.Embedding(buckets, dim)

    def forward(self, x: torch.Tensor, sr_bin: torch.Tensor) -> torch.Tensor:
        return x * self.scale_embed(sr_bin).unsqueeze(-1) + self.bias_embed(sr_bin).unsqueeze(-1)


class Decoder(nn.Module):
    def __init__(self, cfg: AudioVAEConfig):
        super().__init__()
        if cfg.cond_type != "scale_bias" or cfg.cond_out_layer or cfg.use_noise_block:
            raise ValueError("audio_vae_config: only cond_type scale_bias without out layer or noise block "
                             "is supported")
        latent, channels = cfg.latent_dim, cfg.decoder_dim
        if cfg.depthwise:
            layers: list[nn.Module] = [CausalConv1d(latent, latent, 7, padding=3, groups=latent),
                                       CausalConv1d(latent, channels, 1)]
        else:
            layers = [CausalConv1d(latent, channels, 7, padding=3)]
        cond: list[nn.Module | None] = [None] * len(layers)
        buckets = len(cfg.sr_bin_boundaries) + 1 if cfg.sr_bin_boundaries is not None else 0
        output_dim = channels
        for i, stride in enumerate(cfg.decoder_rates):
            input_dim, output_dim = channels // 2 ** i, channels // 2 ** (i + 1)
            layers.append(DecoderBlock(input_dim, output_dim, stride, output_dim if cfg.depthwise else 1))
            cond.append(SampleRateCondition(input_dim, buckets) if buckets else None)
        layers += [Snake1d(output_dim), CausalConv1d(output_dim, 1, 7, padding=3), nn.Tanh()]
        cond += [None, None, None]
        self.model = nn.ModuleList(layers)
        self.sr_cond_model = nn.ModuleList([c if c is not None else nn.Identity() for c in cond]) \
            if buckets else None
        if buckets:
            self.register_buffer("sr_bin_boundaries", torch.tensor(cfg.sr_bin_boundaries, dtype=torch.int32))
        self.out_sample_rate = cfg.out_sample_rate

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """[B, latent_dim, T] -> [B, 1, T * decode_hop_length]."""
        x = z
        if self.sr_cond_model is None:
            for layer in self.model:
                x = layer(x)
            return x
        sr = torch.tensor([self.out_sample_rate], device=z.device, dtype=torch.int32)
        sr_bin = torch.bucketize(sr, self.sr_bin_boundaries)
        for layer, cond in zip(self.model, self.sr_cond_model):
            if isinstance(cond, SampleRateCondition):
                x = cond(x, sr_bin)
            x = layer(x)
        return x


class AudioVAE(nn.Module):
    def __init__(self, cfg: AudioVAEConfig):
        super().__init__()
        self.config = cfg
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder(z)

    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        """[B, samples] at ``sample_rate`` (padded on the right to whole frames) -> [B, latent_dim, T]."""
        if audio.ndim == 2:
            audio = audio.unsqueeze(1)
        hop = self.config.hop_length
        audio = nn.functional.pad(audio, (0, math.ceil(audio.shape[-1] / hop) * hop - audio.shape[-1]))
        return self.encoder(audio)


def decoder_left_context(cfg: AudioVAEConfig) -> int:
    """Latent frames of left context after which a window's new frames decode exactly as in the
    whole sequence: each causal convolution reaches ``left_pad`` samples back at its rate, each
    transposed convolution one input frame."""
    frames = 0.0
    rate = 1                 # samples per latent frame at the current layer
    frames += 6 / rate       # the first convolution (kernel 7), depthwise or not
    for stride in cfg.decoder_rates:
        frames += 1 / rate   # the transposed convolution's previous input frame
        rate *= stride
        frames += sum(6 * d for d in (1, 3, 9)) / rate
    frames += 6 / rate       # the last convolution
    return math.ceil(frames) + 1
