"""Start and stop the speech API as a real process (tests, benchmarks)."""
from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

from client.service_process import ServiceProcess, free_port

ROOT = Path(__file__).resolve().parents[2]


class ShimProcess(ServiceProcess):
    """`python -m client.speech_api` on a free port; ready when /health answers 200 (or, with
    `need_healthy=False`, anything at all: a shim whose Tritons are all down answers 503)."""

    name = "speech shim"
    poll_s = 0.1

    def __init__(self, tritons: list[str], port: int | None = None, api_keys: list[str] | None = None,
                 extra_args: list[str] | None = None, env: dict[str, str] | None = None,
                 log_path: str | Path | None = None):
        super().__init__(log_path, cwd=ROOT)
        self.tritons = tritons
        self.port = port or free_port()
        self.api_keys = api_keys or []
        self.extra_args = extra_args or []
        self.env = env
        self.need_healthy = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        argv = [sys.executable, "-m", "client.speech_api", "--host", "127.0.0.1", "--port", str(self.port)]
        for t in self.tritons:
            argv += ["--triton", t]
        for k in self.api_keys:
            argv += ["--api-key", k]
        return argv + self.extra_args

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("OMNI_API_KEYS", None)
        env.update(self.env or {})
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        return env

    def start(self, timeout_s: float = 60.0, need_healthy: bool = True) -> "ShimProcess":
        self.need_healthy = need_healthy
        return super().start(timeout_s)

    def health(self) -> int | None:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return None

    def ready(self) -> bool:
        status = self.health()
        return status == 200 or (status is not None and not self.need_healthy)

    def stop(self, timeout_s: float = 10.0) -> None:
        super().stop(timeout_s)
