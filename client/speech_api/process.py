"""Start and stop the shim as a real process (tests, benchmarks)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from client.triton_process import free_port

ROOT = Path(__file__).resolve().parents[2]


class ShimProcess:
    """`python -m client.speech_api` on a free port; `wait_ready` waits for /health to answer."""

    def __init__(self, tritons: list[str], port: int | None = None, api_keys: list[str] | None = None,
                 extra_args: list[str] | None = None, env: dict[str, str] | None = None,
                 log_path: str | Path | None = None):
        self.tritons = tritons
        self.port = port or free_port()
        self.api_keys = api_keys or []
        self.extra_args = extra_args or []
        self.env = env
        self.log_path = Path(log_path) if log_path else None
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "client.speech_api", "--host", "127.0.0.1", "--port", str(self.port)]
        for t in self.tritons:
            argv += ["--triton", t]
        for k in self.api_keys:
            argv += ["--api-key", k]
        return argv + self.extra_args

    def start(self, timeout_s: float = 60.0, need_healthy: bool = True) -> "ShimProcess":
        env = dict(os.environ)
        env.pop("OMNI_API_KEYS", None)
        env.update(self.env or {})
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        out = subprocess.DEVNULL
        if self.log_path:
            self._log = open(self.log_path, "ab")
            out = self._log
        self.proc = subprocess.Popen(self.argv(), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.wait_ready(timeout_s, need_healthy)
        return self

    def health(self) -> int | None:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return None

    def wait_ready(self, timeout_s: float, need_healthy: bool = True) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc and self.proc.poll() is not None:
                raise RuntimeError(f"speech shim exited with {self.proc.returncode}; {self.log_tail()}")
            status = self.health()
            if status == 200 or (status is not None and not need_healthy):
                return
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"speech shim not ready after {timeout_s:.0f} s; {self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path or not self.log_path.exists():
            return "no log"
        return "log tail:\n" + "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None
        if self._log:
            self._log.close()
            self._log = None

    def __enter__(self) -> "ShimProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
