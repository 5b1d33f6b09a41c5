"""The preloaded library gives a C process's free heap pages back: glibc alone keeps freed chunks
that lie between live ones resident for as long as the process runs."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from omni_backend import glibc_heaps

# 60,000 chunks of 1,000 bytes from glibc malloc; all but every 64th freed (a live chunk in every
# 64 KB keeps glibc from trimming them off the top): RssAnon MB allocated / after free / after wait
FRAGMENTED = textwrap.dedent("""
    import ctypes, os, sys, time
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    def anon_mb():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon"):
                return int(line.split()[1]) / 1024
    chunks = [libc.malloc(1000) for _ in range(60000)]
    for c in chunks:
        ctypes.memset(c, 1, 1000)
    allocated = anon_mb()
    for i, c in enumerate(chunks):
        if i % 64:
            libc.free(c)
    freed = anon_mb()
    time.sleep(float(sys.argv[1]))
    threads = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
    print(allocated, freed, anon_mb(), os.environ.get("LD_PRELOAD", ""), ",".join(threads))
""")


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    built = glibc_heaps.release_library(tmp_path_factory.mktemp("release"))
    assert built is not None and built.exists()
    return built


def run(env: dict[str, str], wait_s: float = 2.0) -> tuple[float, float, float, str, str]:
    out = subprocess.run([sys.executable, "-c", FRAGMENTED, str(wait_s)], env=env, capture_output=True,
                         text=True, check=True).stdout.split(" ")
    return float(out[0]), float(out[1]), float(out[2]), out[3], out[4].strip()


def test_without_it_glibc_keeps_the_freed_pages():
    allocated, freed, later, _, _ = run({})
    assert allocated > 50 and later > 0.9 * allocated


def test_preloaded_the_freed_pages_go_back_within_the_interval(library):
    env = {}
    glibc_heaps.preload_release(env, library)
    env[glibc_heaps.RELEASE_INTERVAL_ENV] = "0.5"
    allocated, freed, later, preload, threads = run(env)
    assert freed > 0.9 * allocated                 # free() alone gave nothing back
    assert later < 0.3 * allocated                 # the live 1/64 and the interpreter stay
    assert "release-freemem" in threads.split(",")
    assert preload == ""                           # taken off again: children do not inherit it


def test_it_leaves_the_rest_of_ld_preload_and_zero_turns_it_off(library):
    other = "libm.so.6"   # a name the loader finds
    env = {"LD_PRELOAD": other, glibc_heaps.RELEASE_INTERVAL_ENV: "0"}
    glibc_heaps.preload_release(env, library)
    assert env["LD_PRELOAD"].split(" ") == [str(library), other]
    allocated, _, later, preload, threads = run(env, wait_s=1.0)
    assert preload == other
    assert "release-freemem" not in threads.split(",") and later > 0.9 * allocated


def test_the_build_is_reused_and_follows_the_source(library, tmp_path, monkeypatch):
    folder = library.parent.parent
    assert glibc_heaps.release_library(folder) == library
    changed = tmp_path / "release_free_memory.c"
    changed.write_text(glibc_heaps.RELEASE_SOURCE.read_text() + "/* changed */\n")
    monkeypatch.setattr(glibc_heaps, "RELEASE_SOURCE", changed)
    rebuilt = glibc_heaps.release_library(folder)
    assert rebuilt is not None and rebuilt != library and rebuilt.exists()
    assert not list(folder.glob("*/*.part"))
