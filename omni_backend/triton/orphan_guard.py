"""Leave nothing behind when tritonserver dies under a stub process.

The 2.51 stub notices a dead parent, but then tears down its C++ state (Python objects included)
from a background thread without the GIL, which can hang: orphaned stubs (parent pid 1, hundreds
of MB each, ignoring SIGTERM) kept their shared-memory regions in /dev/shm. This guard runs in
every model's stub: when the parent process is gone it unlinks the stub's own region and leaves
with `os._exit`, which runs no destructor that could hang.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

SHM_PREFIX = "triton_python_backend_shm_region_"
_started = False


def stub_shm_region() -> str | None:
    """This stub's shared-memory region name (its second argument), if it is a Triton stub."""
    try:
        argv = Path("/proc/self/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    for arg in argv[1:3]:
        name = arg.decode(errors="replace")
        if name.startswith(SHM_PREFIX):
            return name
    return None


def _watch(parent: int, region: str | None, interval_s: float) -> None:
    stop = threading.Event()
    while not stop.wait(interval_s):
        if os.getppid() != parent:
            if region:
                try:
                    os.unlink(f"/dev/shm/{region}")
                except OSError:
                    pass
            os._exit(1)


def start(interval_s: float = 0.5) -> None:
    """Start the guard once per process (every model calls this in `initialize`)."""
    global _started
    if _started:
        return
    _started = True
    threading.Thread(target=_watch, args=(os.getppid(), stub_shm_region(), interval_s),
                     name="orphan-guard", daemon=True).start()
