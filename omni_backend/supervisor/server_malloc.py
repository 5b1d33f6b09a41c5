"""tritonserver's malloc: glibc's (the default), or jemalloc preloaded into the server alone.

tritonserver is a C++ program with ~560 threads (the Python backend keeps a pool per model
instance). On glibc what it uses stays at ~3.4 MB while its heaps keep the pages freed between live
chunks: its resident memory rose 10-18 % over a 30-minute soak. jemalloc (`OMNI_TRITON_ALLOCATOR=
jemalloc`) gives unused pages back and kept it within 5 %, but 3 of 19 overload runs on it crashed
(against 1 of 42 on glibc), and after one crash two restarts in a row aborted while loading. The
two crashes symbolized to the instruction (one on each allocator) share one cause: the 2.51
backend reading a message it or its stub had freed after declaring a starved stub "not healthy"
(batched_stage.py); whether jemalloc only makes those reads fault more often is not known. A
server that stays up comes first, so glibc is the default.

jemalloc is loaded with the dynamic loader's `--preload`, not `LD_PRELOAD`, so the stubs
tritonserver starts (Python, PyTorch) keep glibc and their own tuned heaps; the loader runs through
a link named `tritonserver`, so the process keeps its name for `ps`, `pkill` and the supervisor.
"""
from __future__ import annotations

import ctypes.util
import os
import struct
import sys
from pathlib import Path

ALLOCATOR_ENV = "OMNI_TRITON_ALLOCATOR"
ALLOCATORS = ("glibc", "jemalloc")
JEMALLOC = "jemalloc"
# No per-thread caches (hundreds of mostly idle threads would each hold some), two arenas like
# the glibc setting it replaces, and a background thread that returns pages unused for 5 s.
JEMALLOC_CONF = "tcache:false,narenas:2,background_thread:true,dirty_decay_ms:5000,muzzy_decay_ms:0"
_PT_INTERP = 3


def choice(env: dict[str, str] | None = None) -> str:
    """The allocator asked for in $OMNI_TRITON_ALLOCATOR (`glibc` when unset)."""
    given = env if env is not None else os.environ
    value = given.get(ALLOCATOR_ENV, "glibc").strip().lower() or "glibc"
    if value not in ALLOCATORS:
        raise SystemExit(f"{ALLOCATOR_ENV}={value!r}: expected one of {', '.join(ALLOCATORS)}")
    return value


def elf_interpreter(binary: str | Path) -> str | None:
    """The dynamic loader a 64-bit ELF program names (its PT_INTERP), or None."""
    with open(binary, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:
            return None
        order = "<" if head[5] == 1 else ">"
        (phoff,) = struct.unpack_from(order + "Q", head, 0x20)
        phentsize, phnum = struct.unpack_from(order + "HH", head, 0x36)
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            ph = f.read(phentsize)
            if struct.unpack_from(order + "I", ph, 0)[0] == _PT_INTERP:
                # Elf64_Phdr: p_offset at byte 8, p_filesz at byte 32
                (offset,), (size,) = struct.unpack_from(order + "Q", ph, 8), struct.unpack_from(order + "Q", ph, 32)
                f.seek(offset)
                return f.read(size).rstrip(b"\0").decode()
    return None


def _loader_preloads() -> bool:
    # the loader's --preload option came with glibc 2.33
    version = os.confstr("CS_GNU_LIBC_VERSION") if "CS_GNU_LIBC_VERSION" in os.confstr_names else ""
    name, _, number = (version or "").partition(" ")
    try:
        return name == "glibc" and tuple(int(x) for x in number.split(".")[:2]) >= (2, 33)
    except ValueError:
        return False


def preload_argv(binary: str | Path, env: dict[str, str] | None = None) -> list[str]:
    """The argv prefix that starts `binary` with jemalloc preloaded where it is asked for ([] for
    glibc); SystemExit, naming what is missing, where it cannot be had."""
    if choice(env) == "glibc":
        return []
    library = ctypes.util.find_library(JEMALLOC)
    loader = elf_interpreter(binary)
    try:
        if not library:
            raise OSError("jemalloc is not installed (Debian: libjemalloc2; `make setup` installs it)")
        if not (loader and _loader_preloads()):
            raise OSError("the C library's loader cannot preload (glibc >= 2.33 needed)")
        link = _named_loader(loader)
    except OSError as e:
        raise SystemExit(f"{ALLOCATOR_ENV}=jemalloc: {e}") from None
    return [str(link), "--preload", library, "--argv0", str(binary)]


def _named_loader(loader: str) -> Path:
    link = Path(sys.prefix) / "share" / "omni-triton" / "loader" / "tritonserver"
    if not (link.is_symlink() and os.readlink(link) == loader):
        link.parent.mkdir(parents=True, exist_ok=True)
        tmp = link.with_name(f".tritonserver.{os.getpid()}")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(loader)
        os.replace(tmp, link)     # atomic: servers started at once see one link
    return link


def conf(env: dict[str, str]) -> str:
    """MALLOC_CONF for the server: ours, then the user's own (jemalloc lets a later option win).
    Idempotent: an environment made by it (the supervisor's, from the process that started it)
    keeps one copy of ours."""
    own = env.get("MALLOC_CONF", "")
    if own == JEMALLOC_CONF or own.startswith(f"{JEMALLOC_CONF},"):
        return own
    return f"{JEMALLOC_CONF},{own}" if own else JEMALLOC_CONF
