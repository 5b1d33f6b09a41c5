"""Media parts of a chat message (OpenAI's content parts) -> what the thinker's encoders read.

``{"type": "input_audio", "input_audio": {"data": <base64>, "format": "wav" | "mp3" | "flac" | ...}}``
is decoded (libsndfile), mixed to mono and resampled to the feature extractor's rate (16 kHz for
the released checkpoints; polyphase, scipy). A recording the server cannot read, one that is empty,
too short for one feature frame or longer than :attr:`AudioLimits.max_seconds` is an
``invalid_request`` naming the part (``messages[2].content[0].input_audio``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from omni_backend.errors import InvalidRequest
from omni_backend.models.qwen3_tts.voice_clone import ReferenceAudioLimits, decode_reference_audio, resample

__all__ = ["AudioLimits", "AUDIO_FORMATS", "Recording", "decode_input_audio", "MEDIA_PART_TYPES"]

# What OpenAI's `input_audio.format` may name; libsndfile reads each (mp3 from libsndfile 1.1).
AUDIO_FORMATS = ("wav", "mp3", "flac", "ogg", "opus")
MEDIA_PART_TYPES = ("input_audio",)


@dataclass(frozen=True)
class AudioLimits:
    max_seconds: float = 120.0            # per recording
    max_bytes: int = 24 * 1024 * 1024     # per recording, decoded from base64
    max_recordings: int = 16              # per request (the whole conversation)


@dataclass(frozen=True)
class Recording:
    """A decoded recording at the feature extractor's rate."""

    waveform: np.ndarray   # float32 [samples], mono
    source_rate: int

    @property
    def samples(self) -> int:
        return int(self.waveform.shape[0])


def decode_input_audio(part: Mapping[str, Any], where: str, sampling_rate: int, hop_length: int,
                       limits: AudioLimits = AudioLimits()) -> Recording:
    """An ``input_audio`` part -> :class:`Recording` at ``sampling_rate``; ``where`` names the part."""
    spec = part.get("input_audio")
    field = f"{where}.input_audio"
    if not isinstance(spec, Mapping):
        raise InvalidRequest(field, "must be an object {data: base64 audio, format: wav | mp3 | flac | ...}")
    unknown = sorted(set(spec) - {"data", "format"})
    if unknown:
        raise InvalidRequest(f"{field}.{unknown[0]}", "unknown field (input_audio takes data and format)")
    fmt = spec.get("format")
    if fmt is not None and (not isinstance(fmt, str) or fmt.lower() not in AUDIO_FORMATS):
        raise InvalidRequest(f"{field}.format", f"must be one of {', '.join(AUDIO_FORMATS)}")
    data = spec.get("data")
    if not isinstance(data, str) or not data.strip():
        raise InvalidRequest(f"{field}.data", "must be base64 audio (or a data URL)")
    min_seconds = hop_length / float(sampling_rate)
    audio, rate = decode_reference_audio(
        data, f"{field}.data", ReferenceAudioLimits(min_seconds=min_seconds, max_seconds=limits.max_seconds,
                                                    max_bytes=limits.max_bytes))
    return Recording(resample(audio, rate, sampling_rate), rate)
