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
import os
import sys
import threading

LARGE_BUFFER_BYTES = 4 << 20
MALLOC_HEAPS = 2
_M_TRIM_THRESHOLD = -1      # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# No per-thread cache of freed small chunks in tritonserver: it runs 96 Python-backend threads per
# model instance, and each one that ever ran a task kept its own cached chunks, pinning heap pages
# (perf/JOURNAL.md: +12.7 % over a 30-minute soak with it, see there for the figure without).
# glibc offers no mallopt for it, so it is a start-up tunable only. The stubs keep it
# (`stub_tunables`).
THREAD_CACHE_CHUNKS = 0
STUB_TUNABLES_ENV = "OMNI_STUB_GLIBC_TUNABLES"
NUMPY_HUGEPAGE_ENV = "NUMPY_MADVISE_HUGEPAGE"


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
    Up to `large_buffer_bytes` free at a heap's top stay there for the next buffers: a fixed mmap
    threshold leaves glibc's trim threshold at 128 KiB (its dynamic rule would raise it to twice
    the mmap threshold), so each step of a model shrank the heap and grew it again, page by page:
    a served request of the small random Qwen3-TTS cost its stubs 4,400-9,200 page faults (300
    with this), and its first audio came 7 ms later, 1.08x the in-process time against 1.03x
    (perf/JOURNAL.md). The periodic `malloc_trim` still gives that top back.
    At most `heaps` malloc heaps (glibc's default is 8 per core): each heap keeps its own
    high-water mark of the medium buffers, one per synthesising thread otherwise; 16 varied
    streams on 8 threads: +512 -> +230 MB, same CPU time. False where the C library has no
    mallopt (not glibc)."""
    keep_arrays_off_huge_pages()
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is None:
        return False
    return (bool(mallopt(_M_MMAP_THRESHOLD, int(large_buffer_bytes))) & bool(mallopt(_M_ARENA_MAX, int(heaps)))
            & bool(mallopt(_M_TRIM_THRESHOLD, int(large_buffer_bytes))))


def keep_arrays_off_huge_pages() -> bool:
    """Stop numpy advising the kernel to back its arrays with 2 MiB pages (it does for every
    array of 4 MiB and more: madvise MADV_HUGEPAGE). An array that malloc carves out of a heap
    (from a free chunk large enough) marks that stretch of the heap for the rest of the process,
    and the kernel's khugepaged then fills each 2 MiB there around any page still in use, also
    while the process is idle, undoing the trim: the hibari synthesizer's kept memory rose 142 ->
    157 MB over 20 minutes of a soak, in 2 MiB steps, with no request in flight (perf/JOURNAL.md).
    Sets `NUMPY_MADVISE_HUGEPAGE=0` for a numpy imported later (and child processes), and turns
    the advice off in one already imported; a caller's own `NUMPY_MADVISE_HUGEPAGE` wins. False
    where the advice stays on."""
    given = os.environ.get(NUMPY_HUGEPAGE_ENV)
    if given is not None:
        return given.strip() == "0"
    os.environ[NUMPY_HUGEPAGE_ENV] = "0"
    if "numpy" not in sys.modules:
        return True
    try:
        from numpy._core import multiarray
    except ImportError:
        try:
            from numpy.core import multiarray
        except ImportError:
            return False
    switch = getattr(multiarray, "_set_madvise_hugepage", None)
    if switch is None:
        return False
    switch(False)
    return True


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
    the speech API's ~69,000 tracked objects took 32 ms on a busy 2-core host, once per interval;
    after `freeze_loaded_objects` it walks only what serving made."""
    gc.collect()
    release_free_memory()


def freeze_loaded_objects() -> None:
    """Collect once, then move every object alive now (imports, a loaded model) out of the
    collector's reach (`gc.freeze`): they live as long as the process, and the full collection
    `release_garbage_and_free_memory` runs every 20 s would otherwise walk them all while it holds
    the GIL. A stub that imports torch and our families holds ~180,000 tracked objects: 57 ms of
    CPU per collection, 0.0 ms once they are frozen. On a starved host that pause stretches:
    under overload an idle entry's event loop (its heartbeat) stood 10.5 s while its trim thread
    was in `gc.collect` (perf/JOURNAL.md). Call it at the end of start-up."""
    gc.collect()
    gc.freeze()


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


_STUB_SETTINGS = [("arena_max", MALLOC_HEAPS), ("mmap_threshold", LARGE_BUFFER_BYTES)]
_SERVER_SETTINGS = [*_STUB_SETTINGS, ("tcache_count", THREAD_CACHE_CHUNKS)]


def _with_ours(env: dict[str, str], settings: list[tuple[str, int]]) -> str:
    given = env.get("GLIBC_TUNABLES", "")
    names = {item.split("=", 1)[0] for item in given.split(":") if item}
    ours = [f"glibc.malloc.{k}={v}" for k, v in settings if f"glibc.malloc.{k}" not in names]
    return ":".join([*(x for x in given.split(":") if x), *ours])


def tunables(env: dict[str, str]) -> str:
    """`GLIBC_TUNABLES` for tritonserver (and the speech API), from the first allocation
    (tritonserver cannot call mallopt itself; on `OMNI_TRITON_ALLOCATOR=jemalloc` it reads none of
    them): two heaps, the fixed mmap threshold of `bound_malloc_retention`, and no per-thread chunk
    cache; settings already in `env` win.
    Not the 4 MiB trim threshold the stubs get (`stub_tunables`): tritonserver's free pages are
    never given back (`malloc_trim`) as the stubs' are every 20 s, so up to 4 MiB would stay at
    the top of each heap for good (a 30-minute soak with it: tritonserver +12 % at minute 20, its
    second heap 4.7 -> 10.3 MB; perf/JOURNAL.md). Not trimmed, because a preloaded thread that
    did it every 20 s crashed it under overload (SIGSEGV in the Python backend's execute path, 2
    of 3 runs against 0 of 3 without), most likely a read of memory the backend had already
    freed, harmless while glibc keeps those pages.
    tritonserver's heap per request (perf/request_memory.py, 150 requests a round), default ->
    2 heaps: warm-up 30 -> 12 KB, later rounds +16.6, +8.8, -4.1, +6.7 -> +1.7, +4.9, -0.4, +0.2 KB."""
    return _with_ours(env, _SERVER_SETTINGS)


def stub_tunables(env: dict[str, str]) -> str:
    """`GLIBC_TUNABLES` for the stubs (their launcher sets them: `OMNI_STUB_GLIBC_TUNABLES`, where a
    value of the user's own wins whole), the same bounds as `bound_malloc_retention` from their
    first allocation: two heaps, the fixed mmap threshold and up to 4 MiB kept free at a heap's
    top (its docstring says why; the stubs give it back every 20 s); settings already in `env` win.
    Unlike tritonserver they keep glibc's per-thread chunk cache: a model step makes and frees
    thousands of small buffers, and the small random Qwen3-TTS's frame step in-process took
    45.2-46.9 ms without it and 42.1-43.6 ms with it; served first audio came 5.5-5.8 ms sooner per
    round. It was off for a while after a stub aborted on a corrupted heap in a soak with it; the
    stubs were freeing Python objects without the GIL then, which the GIL guard
    (supervisor/stub_gil_guard.c) ends (perf/JOURNAL.md)."""
    return _with_ours(env, [*_STUB_SETTINGS, ("trim_threshold", LARGE_BUFFER_BYTES)])
