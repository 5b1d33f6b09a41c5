"""Start and stop a real `tritonserver` process (used by `make serve`, tests and benchmarks)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from omni_backend.triton import server_binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TritonProcess:
    """A tritonserver child process on chosen (or free) ports, stopped for sure on exit."""

    def __init__(self, model_repository: str | Path, http_port: int | None = None,
                 grpc_port: int | None = None, metrics_port: int | None = None,
                 log_path: str | Path | None = None, extra_args: list[str] | None = None):
        self.repo = Path(model_repository).resolve()
        self.http_port = http_port or free_port()
        self.grpc_port = grpc_port or free_port()
        self.metrics_port = metrics_port or free_port()
        self.log_path = Path(log_path) if log_path else None
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def grpc_url(self) -> str:
        return f"localhost:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://localhost:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://localhost:{self.metrics_port}/metrics"

    def args(self) -> list[str]:
        return [f"--model-repository={self.repo}", f"--http-port={self.http_port}",
                f"--grpc-port={self.grpc_port}", f"--metrics-port={self.metrics_port}",
                "--allow-metrics=true", "--strict-readiness=true",
                # Python-backend 2.51 sometimes never stops a decoupled model's instance thread
                # after client cancellations (seen in tests): bound shutdown instead of 30 s.
                "--exit-timeout-secs=5",
                # Large tensors and many concurrent streams: start shared memory bigger than the
                # 1 MiB default so streams do not stall on growth.
                "--backend-config=python,shm-default-byte-size=16777216",
                "--backend-config=python,shm-growth-byte-size=16777216",
                f"--log-verbose={os.environ.get('OMNI_TRITON_LOG_VERBOSE', '0')}", *self.extra_args]

    def start(self, timeout_s: float = 180.0) -> "TritonProcess":
        argv = server_binary.command(self.args())
        out = subprocess.DEVNULL
        if self.log_path:
            self._log = open(self.log_path, "ab")
            out = self._log
        self.proc = subprocess.Popen(argv, env=server_binary.server_env(), stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.wait_ready(timeout_s)
        return self

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc and self.proc.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {self.proc.returncode}; {self.log_tail()}")
            if self.ready():
                return
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"tritonserver not ready after {timeout_s:.0f} s; {self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path or not self.log_path.exists():
            return "no log"
        return "log tail:\n" + "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL the whole process group (the Python stubs too)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                if os.environ.get("DBG"):
                    try:
                        self.proc.wait(timeout=6)
                    except subprocess.TimeoutExpired:
                        for pid in subprocess.run("pgrep -f model_repository/hibari", shell=True, capture_output=True, text=True).stdout.split():
                            print(subprocess.run(["/tmp/v1/bin/py-spy", "dump", "--pid", pid], capture_output=True, text=True).stdout[-4000:])
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.proc = None
        if self._log:
            self._log.close()
            self._log = None

    def __enter__(self) -> "TritonProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
