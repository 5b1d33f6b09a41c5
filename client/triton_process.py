"""Start and stop a real `tritonserver` (used by `make serve`, tests and benchmarks), run by the
supervisor (omni_backend/supervisor): SIGTERM drains it, a dead pipeline is reloaded."""
from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path

from client.service_process import ServiceProcess, free_port
from omni_backend.supervisor.options import READY_PATH
from omni_backend.supervisor import server_binary

__all__ = ["PlainTritonProcess", "TritonProcess", "free_port"]


class TritonProcess(ServiceProcess):
    """A tritonserver child process on chosen (or free) ports, stopped for sure on exit.
    ``host``: bind every frontend to that address only (several servers on one port, each on
    its own loopback address, as pods behind one name); default: every address, reached as
    localhost."""

    name = "tritonserver"

    def __init__(self, model_repository: str | Path, http_port: int | None = None,
                 grpc_port: int | None = None, metrics_port: int | None = None,
                 log_path: str | Path | None = None, extra_args: list[str] | None = None,
                 host: str | None = None):
        super().__init__(log_path)
        self.host = host
        self.repo = Path(model_repository).resolve()
        self.http_port = http_port or free_port()
        self.grpc_port = grpc_port or free_port()
        self.metrics_port = metrics_port or free_port()
        self.extra_args = extra_args or []

    @property
    def grpc_url(self) -> str:
        return f"{self.host or 'localhost'}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host or 'localhost'}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host or 'localhost'}:{self.metrics_port}/metrics"

    def args(self) -> list[str]:
        return [f"--model-repository={self.repo}", f"--http-port={self.http_port}",
                f"--grpc-port={self.grpc_port}", f"--metrics-port={self.metrics_port}",
                "--allow-metrics=true",
                *([f"--http-address={self.host}", f"--grpc-address={self.host}",
                   f"--metrics-address={self.host}"] if self.host else []),
                # Large tensors and many concurrent streams: start shared memory bigger than the
                # 1 MiB default so streams do not stall on growth; grow (rare: a peak of audio held
                # at once, once in a 30-minute soak, never in an overload run) in 16 MiB steps.
                "--backend-config=python,shm-default-byte-size=16777216",
                "--backend-config=python,shm-growth-byte-size=16777216",
                f"--log-verbose={os.environ.get('OMNI_TRITON_LOG_VERBOSE', '0')}", *self.extra_args]

    @property
    def server_pid(self) -> int | None:
        """The tritonserver process the supervisor runs now (None while there is none)."""
        if self.proc is None:
            return None
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def command(self) -> list[str]:
        # under the supervisor: pipelines heal, SIGTERM drains, nothing is left behind
        return [sys.executable, "-m", "omni_backend.supervisor", *self.args()]

    def environment(self) -> dict[str, str]:
        return server_binary.server_env()

    def start(self, timeout_s: float = 180.0) -> "TritonProcess":
        return super().start(timeout_s)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http_url}{READY_PATH}", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False


class PlainTritonProcess(TritonProcess):
    """tritonserver itself with the project's flags, without the supervisor: nothing heals, so
    what Triton alone does after a fault shows."""

    def command(self) -> list[str]:
        return server_binary.command(self.args())

    @property
    def server_pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid
