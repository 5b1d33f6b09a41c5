"""tritonserver's malloc: jemalloc, preloaded into the server alone.

tritonserver is a C++ program with ~560 threads (the Python backend keeps a pool per model
instance). Under glibc its heaps keep the pages freed between live chunks: what it uses stays at
~3.4 MB while its resident heap pages rose 10-18 % over a 30-minute soak, and giving them back
with `malloc_trim` crashed the 2.51 Python backend under overload. jemalloc packs small objects by
size class and returns a run of free pages once it has stayed unused for a while.

The library is loaded with the dynamic loader's `--preload`, not `LD_PRELOAD`, so that the stubs
tritonserver starts (Python, PyTorch) keep glibc and their own tuned heaps. The loader is run
through a link named `tritonserver`, so the process keeps its name for `ps`, `pkill` and `top`.
"""
from __future__ import annotations

import ctypes.util
import os
import struct
import sys
from pathlib import Path

ALLOCATOR_ENV = "OMNI_TRITON_ALLOCATOR"
ALLOCATORS = ("auto", "jemalloc", "glibc")
JEMALLOC = "jemalloc"
# No per-thread caches (hundreds of mostly idle threads would each hold some), two arenas like
# the glibc setting it replaces, and a background thread that returns pages unused for 5 s.
JEMALLOC_CONF = "tcache:false,narenas:2,background_thread:true,dirty_decay_ms:5000,muzzy_decay_ms:0"
_PT_INTERP = 3


def choice(env: dict[str, str] | None = None) -> str:
    """The allocator asked for in $OMNI_TRITON_ALLOCATOR (`auto` when unset)."""
    value = (env if env is not None else os.environ).get(ALLOCATOR_ENV, "auto").strip().lower() or "auto"
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
                offset, size = struct.unpack_from(order + "Q", ph, 8)[0], struct.unpack_from(order + "Q", ph, 32)[0]
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
    """The argv prefix that starts `binary` with jemalloc preloaded ([] for glibc)."""
    asked = choice(env)
    if asked == "glibc":
        return []
    library = ctypes.util.find_library(JEMALLOC)
    loader = elf_interpreter(binary)
    missing = ("jemalloc is not installed (Debian: libjemalloc2; `make setup` installs it)" if not library
               else "the C library's loader cannot preload (glibc >= 2.33 needed)" if not (loader and _loader_preloads())
               else "")
    if missing:
        if asked == "jemalloc":
            raise SystemExit(f"{ALLOCATOR_ENV}=jemalloc: {missing}")
        return []
    return [str(_named_loader(loader)), "--preload", library, "--argv0", str(binary)]


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
    """MALLOC_CONF for the server: ours, then the user's own (jemalloc lets a later option win)."""
    own = env.get("MALLOC_CONF", "")
    return f"{JEMALLOC_CONF},{own}" if own else JEMALLOC_CONF
