"""The streaming encoder contract: one encoder object per response, fed chunk by chunk."""
from __future__ import annotations

import numpy as np


def pcm16(audio: np.ndarray) -> bytes:
    """Float samples in [-1, 1] -> signed 16-bit little-endian bytes."""
    return (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


class StreamEncoder:
    """`encode(chunk)` returns the bytes that are final so far (maybe none), `finish()` the
    rest. Nothing is ever rewritten, so every byte can be sent as soon as it is returned."""
    content_type = "application/octet-stream"

    def __init__(self, sample_rate: int):
        self.sample_rate = sample_rate

    def encode(self, audio: np.ndarray) -> bytes:
        raise NotImplementedError

    def finish(self) -> bytes:
        return b""


class ByteSink:
    """A write-only, non-seekable file object: muxers write headers they never patch later."""

    def __init__(self):
        self._parts: list[bytes] = []

    def write(self, data) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data
