"""Whether the host was starved for CPU over a stretch of time.

A stub whose event loop has not run for a few seconds is stuck only if it could have run: on a
starved host every loop is late, and a healthy stub can also sleep while it waits on tritonserver
(the 2.51 Python backend's `Metric.set` keeps the GIL while it waits for the server's answer, so a
starved server stops the stub's loop with no thread of the stub wanting a CPU). Linux's pressure
stall information (/proc/pressure/cpu) counts the time during which some task waited for a CPU;
sampled every check, it gives that share for any recent window. Without it (kernels built or
booted without PSI) the 1-minute load average stands in: at or above the usable cores, starved.
"""
from __future__ import annotations

import os
from collections import deque

PSI_PATH = "/proc/pressure/cpu"
STARVED_SHARE = 0.5   # some task waited for a CPU at least this share of the window


def _some_total_us(path: str) -> int | None:
    """PSI's cumulative microseconds with some task waiting for a CPU; None without PSI."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("some "):
                    return int(line.rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class CpuPressure:
    def __init__(self, path: str = PSI_PATH, keep_s: float = 120.0):
        self.path = path
        self.keep_s = keep_s
        self.samples: deque[tuple[float, int]] = deque()   # (monotonic s, PSI total us), oldest first
        self.has_psi = _some_total_us(path) is not None

    def sample(self, now: float) -> None:
        """Record PSI's counter (call once per check)."""
        if not self.has_psi:
            return
        total = _some_total_us(self.path)
        if total is None:
            return
        self.samples.append((now, total))
        while self.samples and now - self.samples[0][0] > self.keep_s:
            self.samples.popleft()

    def waiting_share(self, since: float) -> float | None:
        """Share of the time from `since` to the last sample during which some task waited for a
        CPU, from the last sample at or before `since` (else the oldest); None without two samples."""
        if len(self.samples) < 2:
            return None
        start = self.samples[0]
        for sample in self.samples:
            if sample[0] > since:
                break
            start = sample
        end = self.samples[-1]
        if end[0] - start[0] <= 0:
            return None
        return min(1.0, (end[1] - start[1]) / 1e6 / (end[0] - start[0]))

    def starved(self, since: float) -> bool:
        """Whether the host was short of CPU since `since` (monotonic seconds)."""
        if self.has_psi:
            share = self.waiting_share(since)
            return share is None or share >= STARVED_SHARE
        return os.getloadavg()[0] >= len(os.sched_getaffinity(0))
