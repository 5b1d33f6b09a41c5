"""A cloning recording (``ref_audio``) -> the prompt cache the reference builds once per
recording (``build_prompt_cache``: its latent patches, padded on the left to whole patches).

Uploaded bytes are read and checked by the same rules as every cloning family's
(:func:`omni_backend.reference_audio.decode_reference_audio`: wav / flac / mp3,
1..30 s, at most 10 MiB), mixed to mono and resampled to the VAE's ``sample_rate`` (scipy's
polyphase filter; the reference uses librosa's soxr, so a recording at another rate gives close
but not identical latents; at the VAE's rate they are equal).
"""
from __future__ import annotations

import numpy as np
import torch

from omni_backend.reference_audio import decode_reference_audio, resample

from .audio_vae import AudioVAE
from .prompt import encode_recording


def recording_patches(vae: AudioVAE, ref_audio: str, patch_size: int, field: str = "ref_audio") -> torch.Tensor:
    audio, rate = decode_reference_audio(ref_audio, field)
    rate_vae = vae.config.sample_rate
    audio = resample(np.asarray(audio, dtype=np.float32), rate, rate_vae)
    return encode_recording(vae, torch.from_numpy(audio), patch_size)
