"""Whether the host was starved for CPU over a stretch of time.

A stub whose event loop has not run for a few seconds is stuck only if it could have run: on a
starved host every loop is late, and a healthy stub can also sleep while it waits on tritonserver
(the 2.51 Python backend's `Metric.set` keeps the GIL while it waits for the server's answer, so a
starved server stops the stub's loop with no thread of the stub wanting a CPU; what the loop's
thread waits in tells that from a deadlock: `omni_backend.stubs.server_stubs.thread_wait`).
Linux's pressure stall information (/proc/pressure/cpu) counts the time during which some task
waited for a CPU; sampled every check, it gives that share for any recent window. Without it
(kernels built or booted without PSI) the run queue stands in: each sample of /proc/stat's
`procs_running` (tasks running or ready to run, host-wide) above the usable cores counts the time
since the sample before as waited. The 1-minute load average, the last resort, trails a host that
has just become starved by most of a minute.
"""
from __future__ import annotations

import os
from collections import deque

PSI_PATH = "/proc/pressure/cpu"
STAT_PATH = "/proc/stat"
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


def _procs_running(path: str) -> int | None:
    """Tasks running or ready to run now, host-wide (/proc/stat); None where it cannot be read."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("procs_running "):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class CpuPressure:
    def __init__(self, path: str = PSI_PATH, keep_s: float = 120.0, stat_path: str = STAT_PATH):
        self.path = path
        self.stat_path = stat_path
        self.keep_s = keep_s
        self.cores = len(os.sched_getaffinity(0))
        # (monotonic s, cumulative us during which some task waited for a CPU), oldest first
        self.samples: deque[tuple[float, int]] = deque()
        self.has_psi = _some_total_us(path) is not None
        self.source = "psi" if self.has_psi else "run queue" if _procs_running(stat_path) is not None else "load average"

    def sample(self, now: float) -> None:
        """Record how long some task has waited for a CPU so far (call once per check)."""
        if self.source == "psi":
            total = _some_total_us(self.path)
        elif self.source == "run queue":
            running = _procs_running(self.stat_path)
            if running is None:
                return
            total = self.samples[-1][1] if self.samples else 0
            if self.samples and running > self.cores:
                total += int((now - self.samples[-1][0]) * 1e6)
        else:
            return
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
        if self.source == "load average":
            return os.getloadavg()[0] >= self.cores
        share = self.waiting_share(since)
        return share is None or share >= STARVED_SHARE
