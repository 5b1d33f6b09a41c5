"""A client's reference recording (``ref_audio``: voice cloning, a spoken turn), read and checked by
the rules every family that takes one shares: bytes, base64 or a data URL of wav / flac / mp3 / ogg
(through libsndfile), mixed to mono, within :class:`ReferenceAudioLimits`; a violation raises
:class:`InvalidRequest` naming the field. :func:`resample` brings it to the rate a model reads.
:func:`recording_named_if_too_long` names the recording when a clone's prompt does not fit.
"""
from __future__ import annotations

import base64
import binascii
import io
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Mapping
from math import gcd

import numpy as np

from omni_backend.errors import InvalidRequest, PromptTooLongError

__all__ = ["ReferenceAudioLimits", "decode_reference_audio", "recording_named_if_too_long", "resample"]


@contextmanager
def recording_named_if_too_long(request: Mapping[str, Any], field: str = "ref_audio") -> Iterator[None]:
    """Around a stage's ``add_request``: a clone's prompt that leaves the engine no room is a 400
    naming the recording (most of such a prompt is the recording's frames), not ``input``."""
    try:
        yield
    except PromptTooLongError as e:
        if request.get(field) is None:
            raise
        raise InvalidRequest(field, f"{e.reason} with this recording; send a shorter one") from None


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


def resample(audio: np.ndarray, rate: int, target: int) -> np.ndarray:
    """Polyphase resampling (scipy) to ``target``. The reference uses librosa's soxr: the same
    audio at another rate gives close but not identical codes / x-vectors."""
    if rate == target:
        return audio.astype(np.float32, copy=False)
    from scipy.signal import resample_poly

    g = gcd(int(rate), int(target))
    return resample_poly(audio.astype(np.float64), target // g, rate // g).astype(np.float32)
