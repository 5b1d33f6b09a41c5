"""Opus in Ogg, AAC in ADTS and FLAC, each through one PyAV (FFmpeg) muxer per response.

The muxer writes into a non-seekable sink, so it never goes back to patch a header: what it
has written is final and leaves at once. Ogg pages are cut every 20 ms (FFmpeg's default waits a
second). A model rate the codec cannot take is converted by PyAV's resampler on the way in.
"""
from __future__ import annotations

import av
import numpy as np

from client.speech_api.encoders.base import ByteSink, StreamEncoder
from client.speech_api.resample import float_frame


class ContainerEncoder(StreamEncoder):
    container_format = ""
    codec = ""
    bit_rate: int | None = None
    rates: tuple[int, ...] | None = None   # None: any rate
    fallback_rate = 48000
    muxer_options: dict[str, str] = {}

    def __init__(self, sample_rate: int):
        super().__init__(sample_rate)
        self._sink = ByteSink()
        self._out = av.open(self._sink, "w", format=self.container_format, options=dict(self.muxer_options))
        rate = sample_rate if self.rates is None or sample_rate in self.rates else self.fallback_rate
        self._stream = self._out.add_stream(self.codec, rate=rate, layout="mono")
        if self.bit_rate:
            self._stream.bit_rate = self.bit_rate
        self._pts = 0
        self._closed = False

    def encode(self, audio: np.ndarray) -> bytes:
        if audio.size == 0:
            return b""
        frame = float_frame(audio, self.sample_rate, self._pts)
        self._pts += audio.size
        for packet in self._stream.encode(frame):
            self._out.mux(packet)
        return self._sink.take()

    def finish(self) -> bytes:
        if not self._closed:
            self._closed = True
            for packet in self._stream.encode(None):
                self._out.mux(packet)
            self._out.close()
        return self._sink.take()


class OpusEncoder(ContainerEncoder):
    content_type = "audio/ogg"
    container_format = "ogg"
    codec = "libopus"
    bit_rate = 48000
    rates = (8000, 12000, 16000, 24000, 48000)
    muxer_options = {"page_duration": "20000"}


class AacEncoder(ContainerEncoder):
    content_type = "audio/aac"
    container_format = "adts"
    codec = "aac"
    bit_rate = 64000
    rates = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)


class FlacEncoder(ContainerEncoder):
    content_type = "audio/flac"
    container_format = "flac"
    codec = "flac"
