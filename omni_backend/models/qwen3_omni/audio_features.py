"""Recordings -> the audio tower's log-mel features, as the checkpoint's processor makes them.

The released processor runs a Whisper feature extractor (``preprocessor_config.json``:
``feature_size`` mel bins, ``sampling_rate``, ``hop_length``, ``n_fft``) over all recordings of a
prompt at once, padded with ``padding_value`` to the longest (``padding=True``, no truncation):
a centred, reflect-padded STFT with a periodic Hann window, power spectrum without its last frame,
Slaney mel filters from 0 to 8 kHz, ``log10`` floored at 1e-10, the batch's maximum minus 8 as a
floor, then ``(x + 4) / 4``. A recording keeps ``ceil(samples / hop_length)`` frames, at most the
batch's ``longest // hop_length`` (the processor's attention mask, strided by the hop); frames past
it are padding. This module computes the same in torch, in the same
batched shapes, so the features' bits equal the reference's.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch

__all__ = ["AudioFeatureExtractor", "slaney_mel_filters"]


def _hertz_to_mel(freq: np.ndarray | float) -> np.ndarray | float:
    min_log_hertz, min_log_mel, logstep = 1000.0, 15.0, 27.0 / np.log(6.4)
    mels = 3.0 * freq / 200.0
    if isinstance(freq, np.ndarray):
        region = freq >= min_log_hertz
        mels[region] = min_log_mel + np.log(freq[region] / min_log_hertz) * logstep
    elif freq >= min_log_hertz:
        mels = min_log_mel + np.log(freq / min_log_hertz) * logstep
    return mels


def _mel_to_hertz(mels: np.ndarray) -> np.ndarray:
    min_log_hertz, min_log_mel, logstep = 1000.0, 15.0, np.log(6.4) / 27.0
    freq = 200.0 * mels / 3.0
    region = mels >= min_log_mel
    freq[region] = min_log_hertz * np.exp(logstep * (mels[region] - min_log_mel))
    return freq


def slaney_mel_filters(num_frequency_bins: int, num_mel_filters: int, sampling_rate: int,
                       min_frequency: float = 0.0, max_frequency: float = 8000.0) -> np.ndarray:
    """Slaney-scale, Slaney-normalised triangular filters ``[num_frequency_bins, num_mel_filters]``
    (float64), computed as transformers' ``mel_filter_bank`` computes them."""
    mel_freqs = np.linspace(_hertz_to_mel(min_frequency), _hertz_to_mel(max_frequency), num_mel_filters + 2)
    filter_freqs = _mel_to_hertz(mel_freqs)
    fft_freqs = np.linspace(0, sampling_rate // 2, num_frequency_bins)
    diff = np.diff(filter_freqs)
    slopes = np.expand_dims(filter_freqs, 0) - np.expand_dims(fft_freqs, 1)
    down = -slopes[:, :-2] / diff[:-1]
    up = slopes[:, 2:] / diff[1:]
    filters = np.maximum(np.zeros(1), np.minimum(down, up))
    filters *= np.expand_dims(2.0 / (filter_freqs[2:num_mel_filters + 2] - filter_freqs[:num_mel_filters]), 0)
    return filters


@dataclass(frozen=True)
class AudioFeatureExtractor:
    feature_size: int = 128
    sampling_rate: int = 16000
    hop_length: int = 160
    n_fft: int = 400
    padding_value: float = 0.0

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "preprocessor_config.json: ") -> "AudioFeatureExtractor":
        kind = raw.get("feature_extractor_type", "WhisperFeatureExtractor")
        if kind != "WhisperFeatureExtractor":
            raise ValueError(f"{where}feature_extractor_type: {kind!r} is not supported (WhisperFeatureExtractor)")
        if float(raw.get("dither", 0.0)) != 0.0:
            raise ValueError(f"{where}dither: only 0 is supported (dithering draws noise per request)")
        if raw.get("padding_side", "right") != "right":
            raise ValueError(f"{where}padding_side: only right is supported")
        d = cls
        return cls(feature_size=int(raw.get("feature_size", d.feature_size)),
                   sampling_rate=int(raw.get("sampling_rate", d.sampling_rate)),
                   hop_length=int(raw.get("hop_length", d.hop_length)),
                   n_fft=int(raw.get("n_fft", d.n_fft)),
                   padding_value=float(raw.get("padding_value", d.padding_value)))

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str) -> "AudioFeatureExtractor":
        """The checkpoint's ``preprocessor_config.json`` (the Whisper defaults of the released
        family when the file is missing)."""
        path = os.path.join(checkpoint_dir, "preprocessor_config.json")
        if not os.path.isfile(path):
            return cls()
        with open(path, encoding="utf-8") as handle:
            return cls.from_dict(json.load(handle))

    def frames(self, samples: int, longest: int | None = None) -> int:
        """Feature frames a recording of ``samples`` keeps in a batch whose longest recording has
        ``longest`` samples (itself when alone)."""
        longest = int(samples) if longest is None else int(longest)
        return min(-(-int(samples) // self.hop_length), longest // self.hop_length)

    def __call__(self, recordings: Sequence[np.ndarray]) -> list[torch.Tensor]:
        """Mono float32 waveforms at :attr:`sampling_rate` -> features ``[feature_size, frames]``
        each (float32), computed together as the reference processor computes a prompt's."""
        if not recordings:
            return []
        longest = max(len(r) for r in recordings)
        batch = np.full((len(recordings), longest), self.padding_value, dtype=np.float32)
        for row, recording in enumerate(recordings):
            batch[row, :len(recording)] = np.asarray(recording, dtype=np.float32)
        waveform = torch.from_numpy(batch)
        window = torch.hann_window(self.n_fft)
        stft = torch.stft(waveform, self.n_fft, self.hop_length, window=window, return_complex=True)
        magnitudes = (stft[..., :-1].abs() ** 2).contiguous()
        filters = torch.from_numpy(slaney_mel_filters(1 + self.n_fft // 2, self.feature_size,
                                                      self.sampling_rate)).to(torch.float32)
        mel = filters.T @ magnitudes
        log_spec = torch.clamp(mel, min=1e-10).log10()
        peak = log_spec.max(dim=2, keepdim=True)[0].max(dim=1, keepdim=True)[0]
        log_spec = (torch.maximum(log_spec, peak - 8.0) + 4.0) / 4.0
        return [log_spec[row, :, :self.frames(len(r), longest)].clone() for row, r in enumerate(recordings)]
