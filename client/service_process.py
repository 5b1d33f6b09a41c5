"""A server started as a child process for `make serve`, tests and benchmarks: its own process
group (so helper processes die with it), output to a log file, ready when its probe says so, and
stopped for sure: also when the process that started it dies without stopping it (a test run
killed by a timeout), as the kernel then sends it SIGTERM (it drains and cleans up)."""
from __future__ import annotations

import ctypes
import os
import random
import signal
import socket
import subprocess
import time
import weakref
from pathlib import Path


PR_SET_PDEATHSIG = 1


def _end_with_parent() -> None:
    """In the child before exec: SIGTERM when its parent dies (an orphaned server would hold
    its ports, memory and shared memory until someone noticed)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


LOWEST_PORT = 10000
_handed_out: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives outgoing connections and `bind(0)` (Linux's default if unread)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A port free now, below the kernel's ephemeral range and not handed out before by this
    process. A port from `bind(0)` is an ephemeral one: between this check and the server's own
    bind, any outgoing connection on the host (a client of another server) may take it as its
    local port, and the server then fails ("Socket '0.0.0.0:N' already in use"; a whole parallel
    test run lost its shared server to it once)."""
    low, _ = _ephemeral_range()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(LOWEST_PORT, low) if low > LOWEST_PORT + 1000 else 0
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            port = s.getsockname()[1]
        _handed_out.add(port)
        return port
    raise OSError("no free port found below the ephemeral range")


class ServiceProcess:
    """Subclasses give `command()`, `environment()` and `ready()`."""

    name = "service"
    poll_s = 0.25
    _started: "weakref.WeakSet[ServiceProcess]" = weakref.WeakSet()

    @classmethod
    def live(cls) -> list["ServiceProcess"]:
        """The servers of this class started in this process and not stopped yet (a failed test's
        report shows what their logs say)."""
        return [p for p in list(ServiceProcess._started) if isinstance(p, cls) and p.proc is not None]

    def __init__(self, log_path: str | Path | None = None, cwd: str | Path | None = None):
        self.log_path = Path(log_path) if log_path else None
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None
        self._log = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self, timeout_s: float = 60.0):
        out = subprocess.DEVNULL
        if self.log_path:
            self._log = open(self.log_path, "ab")
            out = self._log
        self.proc = subprocess.Popen(self.command(), cwd=self.cwd, env=self.environment(), stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_end_with_parent)
        ServiceProcess._started.add(self)
        self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; {self.log_tail()}")
            if self.ready():
                return
            time.sleep(self.poll_s)
        self.stop()
        raise TimeoutError(f"{self.name} not ready after {timeout_s:.0f} s; {self.log_tail()}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_text()
        return "log tail:\n" + "\n".join(text.splitlines()[-lines:]) if text else "no log"

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL whatever is left of the process group."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
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

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
