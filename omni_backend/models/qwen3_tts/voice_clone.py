"""Reference recordings -> voice-clone prompts for ``base`` checkpoints.

:class:`VoiceEncoder` holds the two encoders of a checkpoint (speech tokenizer encoder for the
reference codes, ECAPA-TDNN for the x-vector) and turns a recording into a
:class:`VoiceClonePrompt`, as the reference ``create_voice_clone_prompt`` does: the recording is
mixed to mono, resampled to 24 kHz when needed, encoded to codes (ICL mode only) and to an
x-vector (both modes).

:func:`decode_reference_audio` reads uploaded bytes (wav / flac / mp3 / ogg through libsndfile)
and enforces the limits a request may carry (:class:`ReferenceAudioLimits`); violations raise
:class:`InvalidRequest` naming the field.
"""
from __future__ import annotations

import base64
import binascii
import io
import os
from dataclasses import dataclass
from math import gcd
from typing import Optional

import numpy as np
import torch

from omni_backend.errors import InvalidRequest

from .prompt import PromptError, VoiceClonePrompt
from .speaker_encoder import SPEAKER_SAMPLE_RATE, SpeakerEncoder
from .speech_encoder import SpeechEncoder

__all__ = ["ReferenceAudioLimits", "decode_reference_audio", "resample", "VoiceEncoder"]


@dataclass(frozen=True)
class ReferenceAudioLimits:
    min_seconds: float = 1.0
    max_seconds: float = 30.0
    max_bytes: int = 10 * 1024 * 1024


def _payload_bytes(value, field: str, limits: ReferenceAudioLimits) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
    elif isinstance(value, str):
        text = value.strip()
        if text.startswith("data:"):
            head, _, text = text.partition(",")
            if ";base64" not in head:
                raise InvalidRequest(field, "data URLs must be base64 encoded (data:audio/wav;base64,...)")
        if len(text) > limits.max_bytes * 4 // 3 + 8:
            raise InvalidRequest(field, f"too large (the limit is {limits.max_bytes} bytes)")
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest(field, "must be a data URL or base64 audio (wav, flac or mp3)") from None
    else:
        raise InvalidRequest(field, "must be a data URL or base64 audio (wav, flac or mp3)")
    if len(data) > limits.max_bytes:
        raise InvalidRequest(field, f"too large ({len(data)} bytes; the limit is {limits.max_bytes})")
    if not data:
        raise InvalidRequest(field, "is empty")
    return data


def decode_reference_audio(value, field: str = "ref_audio",
                           limits: ReferenceAudioLimits = ReferenceAudioLimits()) -> tuple[np.ndarray, int]:
    """Bytes, base64 or a data URL -> (mono float32 waveform, sample rate), within ``limits``."""
    import soundfile as sf

    data = _payload_bytes(value, field, limits)
    try:
        with io.BytesIO(data) as handle:
            audio, rate = sf.read(handle, dtype="float32", always_2d=False)
    except Exception:  # libsndfile says only "Format not recognised" and the like
        raise InvalidRequest(field, "is not audio this server can read (wav, flac or mp3)") from None
    if audio.ndim > 1:
        audio = audio.mean(axis=-1).astype(np.float32)
    seconds = audio.shape[0] / float(rate) if rate else 0.0
    if seconds < limits.min_seconds:
        raise InvalidRequest(field, f"too short ({seconds:.2f} s; at least {limits.min_seconds:g} s)")
    if seconds > limits.max_seconds:
        raise InvalidRequest(field, f"too long ({seconds:.2f} s; at most {limits.max_seconds:g} s)")
    if not np.isfinite(audio).all():
        raise InvalidRequest(field, "contains non-finite samples")
    return np.ascontiguousarray(audio, dtype=np.float32), int(rate)


def resample(audio: np.ndarray, rate: int, target: int = SPEAKER_SAMPLE_RATE) -> np.ndarray:
    """Polyphase resampling (scipy) to ``target``. The reference uses librosa's soxr: the same
    audio at another rate gives close but not identical codes / x-vectors."""
    if rate == target:
        return audio.astype(np.float32, copy=False)
    from scipy.signal import resample_poly

    g = gcd(int(rate), int(target))
    return resample_poly(audio.astype(np.float64), target // g, rate // g).astype(np.float32)


class VoiceEncoder:
    """The two encoders of a ``base`` checkpoint; :meth:`encode` -> :class:`VoiceClonePrompt`."""

    def __init__(self, speech_encoder: SpeechEncoder, speaker_encoder: SpeakerEncoder) -> None:
        self.speech_encoder = speech_encoder
        self.speaker_encoder = speaker_encoder

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str, speaker_encoder_config: dict,
                        device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> "VoiceEncoder":
        return cls(SpeechEncoder.from_checkpoint(os.path.join(checkpoint_dir, "speech_tokenizer"), device=device),
                   SpeakerEncoder.from_checkpoint(checkpoint_dir, speaker_encoder_config, device=device, dtype=dtype))

    def encode_audio(self, audio: np.ndarray, sample_rate: int,
                     with_codes: bool = True) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(x-vector ``[hidden]``, reference codes ``[frames, 16]`` or None) of a recording."""
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim > 1:
            audio = audio.mean(axis=-1).astype(np.float32)
        audio_24k = resample(audio, int(sample_rate), SPEAKER_SAMPLE_RATE)
        codes = self.speech_encoder.encode(audio_24k) if with_codes else None
        return self.speaker_encoder.embed(audio_24k), codes

    def encode(self, audio: np.ndarray, sample_rate: int, ref_text: Optional[str] = None,
               x_vector_only: bool = False) -> VoiceClonePrompt:
        if not x_vector_only and (ref_text is None or not str(ref_text).strip()):
            raise PromptError("ref_text", "required for in-context voice cloning (the transcript of ref_audio), "
                                          "unless x_vector_only_mode is true")
        xvector, codes = self.encode_audio(audio, sample_rate, with_codes=not x_vector_only)
        return VoiceClonePrompt(speaker_embedding=xvector, ref_codes=codes, x_vector_only=bool(x_vector_only),
                                ref_text=None if x_vector_only else str(ref_text))
