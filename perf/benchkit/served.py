"""A benchmark's own tritonserver: started on a built repository, timed, measured, always stopped."""
from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from client.triton_process import TritonProcess

from benchkit.memory import tree_rss_mib
from benchkit.versions import server_version


@dataclass
class ServedRun:
    server: TritonProcess
    startup_s: float
    triton_version: str
    rss_mib: float = float("nan")   # the server and its stubs, read when the run's block ends

    @property
    def grpc_url(self) -> str:
        return self.server.grpc_url


@contextmanager
def served(repo: Path, log: Path, timeout_s: float = 900) -> Iterator[ServedRun]:
    """A tritonserver on `repo` for the block: its start-up seconds and version, and its
    resident memory (server + stubs, not the supervisor) after the block's load."""
    started = time.perf_counter()
    server = TritonProcess(repo, log_path=log)
    try:
        server.start(timeout_s=timeout_s)
        run = ServedRun(server, time.perf_counter() - started, server_version(server.grpc_url))
        yield run
        run.rss_mib = tree_rss_mib(server.server_pid)
    finally:
        server.stop()


def unwind_on_sigterm() -> None:
    """A SIGTERM (a timeout around the benchmark) unwinds through `served`'s stop: the server
    runs in its own session and would otherwise outlive the benchmark."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
