"""Streaming encoders, one per response format."""
from __future__ import annotations

from client.speech_api.encoders.base import StreamEncoder
from client.speech_api.encoders.container import AacEncoder, FlacEncoder, OpusEncoder
from client.speech_api.encoders.mp3 import Mp3Encoder
from client.speech_api.encoders.pcm import PcmEncoder
from client.speech_api.encoders.wav import WavEncoder

ENCODERS: dict[str, type[StreamEncoder]] = {
    "mp3": Mp3Encoder, "opus": OpusEncoder, "aac": AacEncoder,
    "flac": FlacEncoder, "wav": WavEncoder, "pcm": PcmEncoder,
}
CONTENT_TYPES = {name: cls.content_type for name, cls in ENCODERS.items()}


def make_encoder(response_format: str, sample_rate: int) -> StreamEncoder:
    return ENCODERS[response_format](sample_rate)


__all__ = ["CONTENT_TYPES", "ENCODERS", "StreamEncoder", "make_encoder"]
