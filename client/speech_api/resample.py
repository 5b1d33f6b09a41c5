"""A streaming sample-rate converter (FFmpeg's libswresample through PyAV).

One instance per response keeps the filter state across chunks, so chunk seams leave no clicks;
`flush()` returns the samples still inside the filter.
"""
from __future__ import annotations

from fractions import Fraction

import av
import numpy as np


def float_frame(audio: np.ndarray, sample_rate: int, pts: int) -> "av.AudioFrame":
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(audio, np.float32).reshape(1, -1),
                                       format="flt", layout="mono")
    frame.sample_rate = sample_rate
    frame.pts = pts
    frame.time_base = Fraction(1, sample_rate)
    return frame


class Resampler:
    def __init__(self, rate_in: int, rate_out: int):
        self.rate_in = rate_in
        self.rate_out = rate_out
        self._swr = av.AudioResampler(format="flt", layout="mono", rate=rate_out)
        self._pts = 0

    @staticmethod
    def _samples(frames: list) -> np.ndarray:
        if not frames:
            return np.zeros(0, np.float32)
        return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.float32, copy=False)

    def push(self, audio: np.ndarray) -> np.ndarray:
        if audio.size == 0:
            return np.zeros(0, np.float32)
        frame = float_frame(audio, self.rate_in, self._pts)
        self._pts += audio.size
        return self._samples(self._swr.resample(frame))

    def flush(self) -> np.ndarray:
        return self._samples(self._swr.resample(None))
