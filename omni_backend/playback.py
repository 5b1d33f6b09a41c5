"""What a listener hears of a stream: a player that starts at the first audio and then plays
every chunk as soon as it is there (torch- and Triton-free).

It waits whenever a chunk arrives after the audio before it has finished playing: each such wait
is a gap, their sum the underrun. A stream plays continuously when its worst gap is under
:data:`GAP_S` (100 ms); the benchmark (perf/bench.py) and the entry model's live metrics
(``omni_audio_underrun_seconds_total``, ``omni_streams_with_gap_total``) use this one rule.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

__all__ = ["GAP_S", "Playback", "playback_of"]

GAP_S = 0.1   # a wait a listener hears as a gap


@dataclass
class Playback:
    """Fed each chunk's arrival time and duration (seconds), in arrival order."""

    first_s: float | None = None     # arrival of the first audio
    ends_s: float = 0.0              # when the audio received so far finishes playing
    audio_s: float = 0.0
    underrun_s: float = 0.0
    worst_gap_s: float = 0.0
    gaps: list[float] = field(default_factory=list)

    def arrived(self, at_s: float, duration_s: float) -> float:
        """Record a chunk; returns the wait it caused (0.0 when it came in time)."""
        if duration_s <= 0:
            return 0.0
        wait = 0.0
        if self.first_s is None:
            self.first_s, self.ends_s = at_s, at_s
        elif at_s > self.ends_s:
            wait = at_s - self.ends_s
            self.ends_s = at_s
            self.underrun_s += wait
            self.worst_gap_s = max(self.worst_gap_s, wait)
            self.gaps.append(wait)
        self.ends_s += duration_s
        self.audio_s += duration_s
        return wait

    @property
    def continuous(self) -> bool:
        """No gap of :data:`GAP_S` or more."""
        return self.worst_gap_s < GAP_S


def playback_of(chunks: Iterable[tuple[float, float]]) -> Playback:
    """The playback of ``(arrival s, duration s)`` chunks."""
    p = Playback()
    for at_s, duration_s in chunks:
        p.arrived(at_s, duration_s)
    return p
