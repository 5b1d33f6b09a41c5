"""WAV for streaming: a RIFF header whose RIFF and data sizes are 0xFFFFFFFF ("until the end"),
then 16-bit PCM. A header sized for the first chunk would make players stop after it."""
from __future__ import annotations

import struct

import numpy as np

from client.speech_api.encoders.base import StreamEncoder, pcm16

UNKNOWN_SIZE = 0xFFFFFFFF


def streaming_wav_header(sample_rate: int, channels: int = 1, bits: int = 16) -> bytes:
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", 1, channels, sample_rate, sample_rate * block, block, bits)
    return (b"RIFF" + struct.pack("<I", UNKNOWN_SIZE) + b"WAVE"
            + b"fmt " + struct.pack("<I", len(fmt)) + fmt
            + b"data" + struct.pack("<I", UNKNOWN_SIZE))


class WavEncoder(StreamEncoder):
    content_type = "audio/wav"

    def __init__(self, sample_rate: int):
        super().__init__(sample_rate)
        self._header_sent = False

    def _header(self) -> bytes:
        if self._header_sent:
            return b""
        self._header_sent = True
        return streaming_wav_header(self.sample_rate)

    def encode(self, audio: np.ndarray) -> bytes:
        return self._header() + pcm16(audio)

    def finish(self) -> bytes:
        return self._header()
