"""The Qwen3-TTS speaker encoder (``speaker_encoder.*`` of ``base`` checkpoints): an ECAPA-TDNN
that turns a 24 kHz recording into an x-vector of the talker's hidden size, which fills the
speaker slot of a voice-clone prompt.

Front-end (:func:`log_mel_spectrogram`): 128 slaney-normalised mel bands (librosa's filterbank
formula, reimplemented in numpy with the same float64 maths and float32 result), 0..12 kHz, over a
1024-point periodic-Hann STFT with hop 256, the signal reflect-padded by (n_fft - hop) / 2 on both
sides and not centred; magnitude ``sqrt(re^2 + im^2 + 1e-9)``, then ``log(max(mel, 1e-5))``.

Network (:class:`SpeakerEncoder`), channels ``enc_channels`` = [c0, c1, ..., cN]:
  a TDNN block (conv + ReLU), then SE-Res2Net blocks (1x1 TDNN, Res2Net over ``enc_res2net_scale``
  channel groups where group i > 0 runs a dilated TDNN on its slice plus the previous group's output,
  1x1 TDNN, squeeze-excitation gate, residual), multi-layer feature aggregation (the SE-Res2Net
  outputs concatenated, one TDNN), attentive statistics pooling (attention over time from the
  features and their global mean / std, then the attention-weighted mean and std), and a 1x1
  convolution to ``enc_dim``. Every convolution pads "same" by reflection.
Parameter names are those of the released checkpoint.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["SPEAKER_SAMPLE_RATE", "mel_filterbank", "log_mel_spectrogram", "SpeakerEncoder"]

SPEAKER_SAMPLE_RATE = 24000
N_FFT = 1024
HOP = 256
N_MELS = 128
F_MAX = 12000.0


# --------------------------------------------------------------------------- mel front-end

_F_SP = 200.0 / 3          # slaney mel scale: linear below 1 kHz ...
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = math.log(6.4) / 27.0   # ... logarithmic above


def _hz_to_mel(hz: float) -> float:
    if hz >= _MIN_LOG_HZ:
        return _MIN_LOG_MEL + math.log(hz / _MIN_LOG_HZ) / _LOGSTEP
    return hz / _F_SP


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    hz = _F_SP * mels
    log_region = mels >= _MIN_LOG_MEL
    hz[log_region] = _MIN_LOG_HZ * np.exp(_LOGSTEP * (mels[log_region] - _MIN_LOG_MEL))
    return hz


def mel_filterbank(sample_rate: int = SPEAKER_SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS,
                   f_min: float = 0.0, f_max: float = F_MAX) -> np.ndarray:
    """Slaney-normalised triangular mel filters ``[n_mels, n_fft // 2 + 1]`` (float32)."""
    fft_hz = np.fft.rfftfreq(n=n_fft, d=1.0 / sample_rate)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(f_min), _hz_to_mel(f_max), n_mels + 2))
    widths = np.diff(edges)
    distance = edges[:, None] - fft_hz[None, :]
    bank = np.zeros((n_mels, fft_hz.shape[0]), dtype=np.float32)
    for band in range(n_mels):
        rising = -distance[band] / widths[band]
        falling = distance[band + 2] / widths[band + 1]
        bank[band] = np.maximum(0, np.minimum(rising, falling))
    area = 2.0 / (edges[2:n_mels + 2] - edges[:n_mels])
    bank *= area[:, None]
    return bank


_FILTERBANKS: dict[tuple, torch.Tensor] = {}


def log_mel_spectrogram(audio: torch.Tensor, sample_rate: int = SPEAKER_SAMPLE_RATE) -> torch.Tensor:
    """``[B, samples]`` float32 audio -> ``[B, 128, frames]`` log mel spectrogram (module doc)."""
    key = (sample_rate,)
    if key not in _FILTERBANKS:
        _FILTERBANKS[key] = torch.from_numpy(mel_filterbank(sample_rate)).float()
    bank = _FILTERBANKS[key].to(audio.device)
    window = torch.hann_window(N_FFT).to(audio.device)
    pad = (N_FFT - HOP) // 2
    padded = F.pad(audio.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    spectrum = torch.stft(padded, N_FFT, hop_length=HOP, win_length=N_FFT, window=window, center=False,
                          pad_mode="reflect", normalized=False, onesided=True, return_complex=True)
    magnitude = torch.sqrt(torch.view_as_real(spectrum).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(torch.matmul(bank, magnitude), min=1e-5))


# --------------------------------------------------------------------------- ECAPA-TDNN


def _same_conv(in_ch: int, out_ch: int, kernel: int, dilation: int = 1) -> nn.Conv1d:
    return nn.Conv1d(in_ch, out_ch, kernel, dilation=dilation, padding="same", padding_mode="reflect")


class _TDNN(nn.Module):
    """Convolution ("same", reflect) + ReLU; parameters ``conv.*``."""

    def __init__(self, in_ch: int, out_ch: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.conv = _same_conv(in_ch, out_ch, kernel, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


class _Res2Net(nn.Module):
    def __init__(self, channels: int, scale: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.scale = scale
        self.blocks = nn.ModuleList(_TDNN(channels // scale, channels // scale, kernel, dilation)
                                    for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        groups = torch.chunk(x, self.scale, dim=1)
        out = [groups[0]]
        previous = None
        for i in range(1, self.scale):
            previous = self.blocks[i - 1](groups[i] if i == 1 else groups[i] + previous)
            out.append(previous)
        return torch.cat(out, dim=1)


class _SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, bottleneck: int) -> None:
        super().__init__()
        self.conv1 = _same_conv(channels, bottleneck, 1)
        self.conv2 = _same_conv(bottleneck, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.conv2(torch.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gate


class _SERes2NetBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, scale: int, se: int, kernel: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = _TDNN(in_ch, out_ch, 1, 1)
        self.res2net_block = _Res2Net(out_ch, scale, kernel, dilation)
        self.tdnn2 = _TDNN(out_ch, out_ch, 1, 1)
        self.se_block = _SqueezeExcitation(out_ch, se)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x


class _AttentiveStatsPool(nn.Module):
    EPS = 1e-12

    def __init__(self, channels: int, attention: int) -> None:
        super().__init__()
        self.tdnn = _TDNN(channels * 3, attention, 1, 1)
        self.conv = _same_conv(attention, channels, 1)

    @classmethod
    def _stats(cls, x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = (weights * x).sum(2)
        std = torch.sqrt((weights * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(cls.EPS))
        return mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = x.shape[-1]
        # uniform weights over all frames (the reference's all-ones mask divided by its sum)
        mask = torch.ones(x.shape[0], 1, frames, dtype=x.dtype, device=x.device)
        uniform = mask / mask.sum(dim=2, keepdim=True)
        mean, std = self._stats(x, uniform)
        context = torch.cat([x, mean.unsqueeze(2).repeat(1, 1, frames), std.unsqueeze(2).repeat(1, 1, frames)], dim=1)
        scores = self.conv(torch.tanh(self.tdnn(context)))
        scores = scores.masked_fill(mask == 0, float("-inf"))
        mean, std = self._stats(x, F.softmax(scores, dim=2))
        return torch.cat((mean, std), dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    """ECAPA-TDNN (module doc). ``forward(mels [B, frames, mel_dim]) -> [B, enc_dim]``;
    :meth:`embed` takes 24 kHz audio."""

    def __init__(self, config: Mapping) -> None:
        super().__init__()
        channels = list(config["enc_channels"])
        kernels = list(config["enc_kernel_sizes"])
        dilations = list(config["enc_dilations"])
        if not (len(channels) == len(kernels) == len(dilations)):
            raise ValueError("speaker_encoder_config: enc_channels, enc_kernel_sizes and enc_dilations "
                             "must have the same length")
        self.sample_rate = int(config.get("sample_rate", SPEAKER_SAMPLE_RATE))
        blocks: list[nn.Module] = [_TDNN(int(config["mel_dim"]), channels[0], kernels[0], dilations[0])]
        for i in range(1, len(channels) - 1):
            blocks.append(_SERes2NetBlock(channels[i - 1], channels[i], int(config["enc_res2net_scale"]),
                                          int(config["enc_se_channels"]), kernels[i], dilations[i]))
        self.blocks = nn.ModuleList(blocks)
        self.mfa = _TDNN(channels[-1], channels[-1], kernels[-1], dilations[-1])
        self.asp = _AttentiveStatsPool(channels[-1], int(config["enc_attention_channels"]))
        self.fc = _same_conv(channels[-1] * 2, int(config["enc_dim"]), 1)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        x = mels.transpose(1, 2)
        outputs = []
        for block in self.blocks:
            x = block(x)
            outputs.append(x)
        x = self.mfa(torch.cat(outputs[1:], dim=1))
        return self.fc(self.asp(x)).squeeze(-1)

    @torch.inference_mode()
    def embed(self, audio_24k: np.ndarray | torch.Tensor) -> torch.Tensor:
        """The x-vector ``[enc_dim]`` (float32, on CPU) of one mono 24 kHz recording."""
        weight = self.fc.weight
        audio = torch.as_tensor(np.asarray(audio_24k, dtype=np.float32)).unsqueeze(0)
        mels = log_mel_spectrogram(audio, self.sample_rate).transpose(1, 2)
        return self(mels.to(device=weight.device, dtype=weight.dtype))[0].float().cpu()

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str, config: Mapping, device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32) -> "SpeakerEncoder":
        """Load ``speaker_encoder.*`` from the checkpoint's model.safetensors (strict)."""
        from .checkpoint import read_state_dict

        state = read_state_dict(checkpoint_dir, "speaker_encoder.")
        if not state:
            raise ValueError(f"{checkpoint_dir}: no speaker_encoder.* weights (is this a base checkpoint?)")
        with torch.device("meta"):
            encoder = cls(config)
        # assign, not copy: the tensors keep the file's memory layout, which is what the reference
        # computes with (on CPU a convolution's summation order depends on its weight's alignment)
        state = {name: tensor.to(device=device, dtype=dtype) for name, tensor in state.items()}
        encoder.load_state_dict(state, strict=True, assign=True)
        return encoder.eval().requires_grad_(False)
