"""Busy processes that starve a host of CPU, for tests and benchmarks of a server under overload.

Each burner spins in Python and dies with the process that started it, however that one ends
(Linux's PR_SET_PDEATHSIG): a harness stopped by a signal once left 16 of them burning and slowed
everything that ran next.
"""
from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator

_BURN = ("import ctypes, os, signal, sys; PR_SET_PDEATHSIG = 1\n"
         "ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)\n"
         "if os.getppid() != int(sys.argv[1]): sys.exit()\n"
         "while True: pass")


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))


def burners(n: int) -> list[subprocess.Popen]:
    """Start `n` busy processes (stop them with `stop`)."""
    return [subprocess.Popen([sys.executable, "-c", _BURN, str(os.getpid())]) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()


@contextmanager
def starved(per_core: int = 8) -> Iterator[list[subprocess.Popen]]:
    """`per_core` busy processes per usable core while the block runs."""
    procs = burners(per_core * usable_cores())
    try:
        yield procs
    finally:
        stop(procs)
