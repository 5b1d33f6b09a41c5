"""A cloning recording (``ref_audio``) -> the prompt cache the reference builds once per
recording (``build_prompt_cache``: its latent patches, padded to whole patches on the left for
continuation, on the right for a reference).

Uploaded bytes are read and checked by the same rules as every cloning family's
(:func:`omni_backend.reference_audio.decode_reference_audio`: wav / flac / mp3,
1..30 s, at most 10 MiB), mixed to mono and resampled to the VAE's ``sample_rate`` as the
reference's ``librosa.load(path, sr=..., mono=True)`` does (librosa 0.11's default ``soxr_hq``):
:func:`resample_as_reference`, so a recording at another rate gives the reference's samples.
"""
from __future__ import annotations

import numpy as np
import torch

from omni_backend.reference_audio import decode_reference_audio

from .audio_vae import AudioVAE
from .prompt import encode_recording


def resample_as_reference(audio: np.ndarray, rate: int, target: int) -> np.ndarray:
    """``librosa.resample(audio, orig_sr=rate, target_sr=target)`` with its defaults: soxr at
    ``soxr_hq`` quality, then cut or zero-padded to ``ceil(len * target / rate)`` samples."""
    audio = np.asarray(audio, dtype=np.float32)
    if rate == target:
        return audio
    import soxr

    out = soxr.resample(audio, rate, target, quality="soxr_hq")
    n = int(np.ceil(audio.shape[0] * (float(target) / rate)))
    if out.shape[0] > n:
        out = out[:n]
    elif out.shape[0] < n:
        out = np.pad(out, (0, n - out.shape[0]))
    return np.asarray(out, dtype=np.float32)


def recording_patches(vae: AudioVAE, ref_audio: str, patch_size: int, field: str = "ref_audio",
                      pad: str = "left") -> torch.Tensor:
    audio, rate = decode_reference_audio(ref_audio, field)
    audio = resample_as_reference(audio, rate, vae.config.sample_rate)
    return encode_recording(vae, torch.from_numpy(np.ascontiguousarray(audio)), patch_size, pad)
