"""How much freed memory glibc keeps: bounded for long-running processes with many threads.

glibc gives each thread that allocates a heap of its own (up to 8 per core), and every heap keeps
its own high-water mark of freed medium buffers; after a large free it also raises its mmap
threshold to 32 MiB, so big buffers land in those heaps too. A server process with dozens of
threads (request handlers, BLS readers, encoders) thus keeps the peak of every thread's work.
"""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import hashlib
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

LARGE_BUFFER_BYTES = 4 << 20
MALLOC_HEAPS = 2
_M_MMAP_THRESHOLD = -3      # glibc's mallopt parameter numbers (malloc.h)
_M_ARENA_MAX = -8


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_LIBC = _libc()


def bound_malloc_retention(large_buffer_bytes: int = LARGE_BUFFER_BYTES, heaps: int = MALLOC_HEAPS) -> bool:
    """Process-wide glibc settings for a long-running process (call it early).

    Buffers of `large_buffer_bytes` and more get their own mmap, so freeing one returns it to
    the OS at once (a fixed threshold also stops glibc raising it to 32 MiB). Such buffers are few
    per sentence: thread CPU time for 40 sentences 3.34 -> 3.41 s (at 256 KiB: +35%).
    At most `heaps` malloc heaps (glibc's default is 8 per core): each heap keeps its own
    high-water mark of the medium buffers, one per synthesising thread otherwise; 16 varied
    streams on 8 threads: +512 -> +230 MB, same CPU time. False where the C library has no
    mallopt (not glibc)."""
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, int(large_buffer_bytes))) & bool(mallopt(_M_ARENA_MAX, int(heaps)))


def release_free_memory() -> None:
    """Give the free pages of every heap back to the OS (glibc `malloc_trim`). Bounding the
    heaps still left each one at its fragmented high-water mark: a synthesiser process grew
    134-186 MB over five rounds of 16 varied streams; trimming after each sentence, 0-4 MB."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)


def release_garbage_and_free_memory() -> None:
    """A full garbage collection, then `release_free_memory`. Objects in a reference cycle (an
    error's traceback holding the frame that holds it) are freed only by a full collection, and
    an idle process allocates nothing, so it never runs one: a cycle that reaches a stream's
    buffers would keep them for as long as the process is idle. It holds the GIL while it runs:
    the speech API's ~69,000 tracked objects took 32 ms on a busy 2-core host (a stub has
    ~30,000), once per interval."""
    gc.collect()
    release_free_memory()


# A long-running server's garbage and free pages are given back this often.
TRIM_INTERVAL_S = 20.0


async def release_free_memory_every(seconds: float = TRIM_INTERVAL_S) -> None:
    """Forever: `release_garbage_and_free_memory` every `seconds`, in a worker thread. The
    bounded heaps of a process serving thousands of varied requests still end each at a
    fragmented high-water mark (the speech API: +64 MB anonymous memory over a 30-minute soak);
    what is free there goes back."""
    while True:
        await asyncio.sleep(seconds)
        await asyncio.to_thread(release_garbage_and_free_memory)


def release_free_memory_in_background(seconds: float = TRIM_INTERVAL_S) -> None:
    """`bound_malloc_retention` now and `release_garbage_and_free_memory` every `seconds` from a
    daemon thread: for a process without an event loop of its own to do it (a Triton stub)."""
    bound_malloc_retention()

    def run() -> None:
        while True:
            threading.Event().wait(seconds)
            release_garbage_and_free_memory()
    threading.Thread(target=run, name="release-free-memory", daemon=True).start()


def tunables(env: dict[str, str]) -> str:
    """`GLIBC_TUNABLES` for a child that cannot call mallopt itself (tritonserver): the same bounds
    as `bound_malloc_retention`, fixed from its first allocation; settings already in `env` win.
    tritonserver's heap per request (perf/request_memory.py, 150 requests a round), default ->
    2 heaps: warm-up 30 -> 12 KB, later rounds +16.6, +8.8, -4.1, +6.7 -> +1.7, +4.9, -0.4, +0.2 KB."""
    given = env.get("GLIBC_TUNABLES", "")
    names = {item.split("=", 1)[0] for item in given.split(":") if item}
    ours = [f"glibc.malloc.{k}={v}" for k, v in (("arena_max", MALLOC_HEAPS), ("mmap_threshold", LARGE_BUFFER_BYTES))
            if f"glibc.malloc.{k}" not in names]
    return ":".join([*(x for x in given.split(":") if x), *ours])


RELEASE_SOURCE = Path(__file__).with_name("release_free_memory.c")
RELEASE_LIBRARY = "libomni_release_free_memory.so"
RELEASE_INTERVAL_ENV = "OMNI_RELEASE_FREE_MEMORY_S"


def release_library(folder: Path | None = None) -> Path | None:
    """The shared library that makes a C process (tritonserver) call `malloc_trim` every
    `TRIM_INTERVAL_S` once preloaded, built from release_free_memory.c with the system C compiler
    on first use (rebuilt when the source changes). None, with a warning, without a compiler."""
    source = RELEASE_SOURCE.read_bytes()
    folder = folder or Path(sys.prefix) / "share" / "omni-triton"
    built = folder / f"{hashlib.sha256(source).hexdigest()[:16]}" / RELEASE_LIBRARY
    if built.exists():
        return built
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        print(f"warning: no C compiler to build {RELEASE_LIBRARY}: tritonserver keeps the free "
              "pages of its heap", file=sys.stderr)
        return None
    built.parent.mkdir(parents=True, exist_ok=True)
    partial = built.with_suffix(f".{os.getpid()}.part")   # concurrent builders each write their own
    done = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(partial), str(RELEASE_SOURCE),
                           "-lpthread"], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"warning: building {RELEASE_LIBRARY} failed: tritonserver keeps the free pages of its "
              f"heap\n{done.stderr.strip()}", file=sys.stderr)
        partial.unlink(missing_ok=True)
        return None
    os.replace(partial, built)
    return built


def preload_release(env: dict[str, str], library: Path | None) -> None:
    """Set `env` so the process started with it preloads `library` (ahead of any LD_PRELOAD
    already there; the library takes itself off again, so that process's children do not get
    it) and releases its free pages every `TRIM_INTERVAL_S` unless the interval is already set."""
    if library is None:
        return
    given = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = " ".join(x for x in (str(library), given) if x)
    env.setdefault(RELEASE_INTERVAL_ENV, f"{TRIM_INTERVAL_S:g}")
