"""OpenAI's `speed` (0.25..4.0): the model's own control where it has one, else a time-stretch.

A pipeline whose adapter has a `speed` field (e.g. 0.5..2.0) gets the requested speed clamped
to its range; whatever is left (there: 0.25 -> 0.5 native x 0.5 stretched; 4.0 -> 2.0 native x
2.0 stretched) is done here by `TimeStretch`, which changes duration but keeps pitch. A pipeline
without a speed control is stretched for the whole factor.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SpeedPlan:
    requested: float
    native: float      # passed to the model as its `speed` (1.0: not passed)
    stretch: float     # tempo of the shim's time-stretch (1.0: none; 2.0: half the duration)


def plan_speed(speed: float, native_range: tuple[float, float] | None) -> SpeedPlan:
    if native_range is None:
        return SpeedPlan(speed, 1.0, speed)
    lo, hi = native_range
    native = min(max(speed, lo), hi)
    stretch = speed / native
    if abs(stretch - 1.0) < 1e-9:
        stretch = 1.0
    return SpeedPlan(speed, native, stretch)


class TimeStretch:
    """Streaming WSOLA: overlap-add of Hann frames whose input positions advance `tempo` times
    faster than their output positions, each shifted within a small tolerance to the spot that
    best continues the previous frame's waveform (so pitch and timbre stay as they are).

    Latency is about one frame plus the tolerance (~50 ms of input); `push` returns what is
    final so far, `flush` the rest, trimmed so the total is `round(input / tempo)` samples.
    """

    def __init__(self, tempo: float, sample_rate: int, frame_ms: float = 40.0, tolerance_ms: float = 10.0):
        if tempo <= 0:
            raise ValueError("tempo must be > 0")
        self.tempo = float(tempo)
        n = max(16, int(sample_rate * frame_ms / 1000.0)) // 2 * 2
        self.frame = n
        self.hop_out = n // 2
        self.hop_in = self.hop_out * self.tempo
        self.tolerance = max(1, int(sample_rate * tolerance_ms / 1000.0))
        self.window = (0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n)).astype(np.float32)
        # Input in "padded" coordinates: hop_out zeros lead in, so the first output samples are
        # not faded in by the first frame's rising half-window; they are dropped again below.
        self.buf = np.zeros(self.hop_out, np.float32)
        self.base = 0                       # padded index of buf[0]
        self.k = 0                          # next frame number
        self.prev: int | None = None        # padded position of the previous frame
        self.ola = np.zeros(n, np.float32)
        self.to_drop = self.hop_out
        self.n_in = 0
        self.n_out = 0

    def _available(self) -> int:
        return self.base + len(self.buf)

    def _x(self, start: int, length: int) -> np.ndarray:
        return self.buf[start - self.base:start - self.base + length]

    def _next_position(self) -> int | None:
        """Where frame k starts in the input, or None until enough input is there."""
        n, tol = self.frame, self.tolerance
        nominal = int(round(self.k * self.hop_in))
        if self.prev is None:
            return nominal if nominal + n <= self._available() else None
        lo = max(nominal - tol, self.base)
        hi = nominal + tol
        natural = self.prev + self.hop_out
        if max(hi + n, natural + n) > self._available():
            return None
        target = self._x(natural, n)
        region = self._x(lo, hi - lo + n)
        corr = np.correlate(region, target, mode="valid")
        best = int(np.argmax(corr))
        return lo + best if corr[best] > 0 else max(nominal, lo)

    def _run(self) -> list[np.ndarray]:
        out = []
        while True:
            pos = self._next_position()
            if pos is None:
                break
            self.ola += self._x(pos, self.frame) * self.window
            ready = self.ola[:self.hop_out].copy()
            self.ola[:self.hop_out] = self.ola[self.hop_out:]
            self.ola[self.hop_out:] = 0.0
            self.prev = pos
            self.k += 1
            if self.to_drop:
                drop = min(self.to_drop, len(ready))
                ready = ready[drop:]
                self.to_drop -= drop
            if ready.size:
                out.append(ready)
            keep_from = min(int(round(self.k * self.hop_in)) - self.tolerance, self.prev + self.hop_out)
            if keep_from > self.base:
                self.buf = self.buf[keep_from - self.base:]
                self.base = keep_from
        return out

    def push(self, audio: np.ndarray) -> np.ndarray:
        audio = np.asarray(audio, np.float32).reshape(-1)
        self.n_in += audio.size
        self.buf = np.concatenate([self.buf, audio])
        parts = self._run()
        res = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        self.n_out += res.size
        return res

    def flush(self) -> np.ndarray:
        expected = int(round(self.n_in / self.tempo))
        parts: list[np.ndarray] = []
        have = self.n_out
        while have < expected:
            self.buf = np.concatenate([self.buf, np.zeros(2 * self.frame + 2 * self.tolerance, np.float32)])
            for p in self._run():
                parts.append(p)
                have += p.size
        res = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        res = res[:max(0, expected - self.n_out)]
        self.n_out += res.size
        return res
