"""Raw PCM as OpenAI defines it: 24 kHz, signed 16-bit little-endian, mono, no header.
Audio at another rate is resampled on the fly (one resampler per response)."""
from __future__ import annotations

import numpy as np

from client.speech_api.encoders.base import StreamEncoder, pcm16
from client.speech_api.resample import Resampler

PCM_RATE = 24000


class PcmEncoder(StreamEncoder):
    content_type = "audio/pcm"

    def __init__(self, sample_rate: int):
        super().__init__(sample_rate)
        self._resampler = Resampler(sample_rate, PCM_RATE) if sample_rate != PCM_RATE else None

    @property
    def output_rate(self) -> int:
        return PCM_RATE

    def encode(self, audio: np.ndarray) -> bytes:
        if self._resampler is not None:
            audio = self._resampler.push(audio)
        return pcm16(audio)

    def finish(self) -> bytes:
        return pcm16(self._resampler.flush()) if self._resampler is not None else b""
