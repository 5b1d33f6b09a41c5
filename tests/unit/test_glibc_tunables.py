"""tritonserver (and every stub it starts) gets bounded glibc heaps from its first allocation."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from client.service_process import free_port

from omni_backend import glibc_heaps
from omni_backend.supervisor import server_binary

LOADER = "/lib64/ld-linux-x86-64.so.2"
ROOT = Path(__file__).resolve().parents[2]


def test_the_server_environment_bounds_glibc_heaps() -> None:
    env = server_binary.server_env()
    server = env["GLIBC_TUNABLES"].split(":")
    assert f"glibc.malloc.arena_max={glibc_heaps.MALLOC_HEAPS}" in server
    assert f"glibc.malloc.mmap_threshold={glibc_heaps.LARGE_BUFFER_BYTES}" in server
    assert f"glibc.malloc.tcache_count={glibc_heaps.THREAD_CACHE_CHUNKS}" in server
    # never trimmed, tritonserver keeps glibc's 128 KiB: 4 MiB would stay at each heap's top
    assert not any(t.startswith("glibc.malloc.trim_threshold") for t in server)
    stubs = env[glibc_heaps.STUB_TUNABLES_ENV].split(":")
    assert f"glibc.malloc.arena_max={glibc_heaps.MALLOC_HEAPS}" in stubs
    assert f"glibc.malloc.mmap_threshold={glibc_heaps.LARGE_BUFFER_BYTES}" in stubs
    assert f"glibc.malloc.trim_threshold={glibc_heaps.LARGE_BUFFER_BYTES}" in stubs
    assert not any(t.startswith("glibc.malloc.tcache_count") for t in stubs)   # glibc's cache


@pytest.mark.parametrize("make, ours", [
    (glibc_heaps.tunables, [f"glibc.malloc.mmap_threshold={glibc_heaps.LARGE_BUFFER_BYTES}"]),
    (glibc_heaps.stub_tunables, [f"glibc.malloc.mmap_threshold={glibc_heaps.LARGE_BUFFER_BYTES}",
                                 f"glibc.malloc.trim_threshold={glibc_heaps.LARGE_BUFFER_BYTES}"]),
])
def test_a_users_own_tunables_win_and_are_kept(make, ours) -> None:
    given = "glibc.malloc.arena_max=8:glibc.pthread.rseq=0:glibc.malloc.tcache_count=7"
    out = make({"GLIBC_TUNABLES": given}).split(":")
    assert out == ["glibc.malloc.arena_max=8", "glibc.pthread.rseq=0", "glibc.malloc.tcache_count=7", *ours]


@pytest.mark.skipif(not Path(LOADER).exists(), reason="the x86-64 glibc loader lists its tunables")
@pytest.mark.parametrize("make", [glibc_heaps.tunables, glibc_heaps.stub_tunables])
def test_a_child_started_with_them_reads_them(make) -> None:
    # glibc reads GLIBC_TUNABLES when a process starts; its loader lists what it read
    env = {"GLIBC_TUNABLES": make({})}
    shown = subprocess.run([LOADER, "--list-tunables"], env=env, capture_output=True, text=True)
    values = {name.strip(): value.split("(")[0].strip()
              for name, _, value in (line.partition(":") for line in shown.stdout.splitlines())}
    assert values["glibc.malloc.arena_max"] == hex(glibc_heaps.MALLOC_HEAPS)
    assert values["glibc.malloc.mmap_threshold"] == hex(glibc_heaps.LARGE_BUFFER_BYTES)
    # (an unset tcache_count lists as 0x0 too: the strings are checked above)
    if make is glibc_heaps.stub_tunables:
        assert values["glibc.malloc.trim_threshold"] == hex(glibc_heaps.LARGE_BUFFER_BYTES)


def test_the_speech_api_started_as_a_program_restarts_itself_with_them() -> None:
    """glibc reads its tunables only at start: `python -m client.speech_api` started without them
    executes itself again with them (same pid) before it serves."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env["PYTHONPATH"] = str(ROOT)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "client.speech_api", "--triton", "localhost:1", "--port",
                             str(port)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except urllib.error.HTTPError:   # 503: no Triton behind it, but it serves
                break
            except OSError:
                assert proc.poll() is None, "the speech API exited"
                time.sleep(0.2)
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        # the loader shortens the variable in the process's initial environment to what it
        # parsed first; that it is there at all shows the second start
        assert any(item.startswith(b"GLIBC_TUNABLES=glibc.malloc.") for item in environ)
    finally:
        proc.terminate()
        proc.wait(10)


# An array of 8 MiB, alive while the process reads which of its mappings were advised to use
# huge pages (`hg` in smaps' VmFlags); the bounds are set before numpy is imported, or after.
_ADVISED = """
import sys
from omni_backend import glibc_heaps
if sys.argv[1] == "bounded-first":
    glibc_heaps.bound_malloc_retention()
import numpy as np
if sys.argv[1] == "bounded-after":
    glibc_heaps.bound_malloc_retention()
a = np.ones(1 << 20)
flags = [line for line in open("/proc/self/smaps") if line.startswith("VmFlags:")]
print(sum(" hg" in line for line in flags), a[-1])
"""


def _advised_mappings(mode: str, **env: str) -> int:
    base = {k: v for k, v in os.environ.items() if k != glibc_heaps.NUMPY_HUGEPAGE_ENV}
    done = subprocess.run([sys.executable, "-c", _ADVISED, mode], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**base, **env})
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[0])


@pytest.mark.skipif(not Path("/sys/kernel/mm/transparent_hugepage/enabled").exists(),
                    reason="a kernel without transparent huge pages: nothing to advise")
def test_a_bounded_process_asks_for_no_huge_pages_for_its_arrays() -> None:
    """numpy would advise huge pages for the array (and, for one carved out of a malloc heap, for
    that stretch of the heap for good, which the kernel then fills 2 MiB at a time)."""
    if _advised_mappings("default") == 0:
        pytest.skip("numpy gives no huge-page advice here")
    assert _advised_mappings("bounded-first") == 0
    assert _advised_mappings("bounded-after") == 0
    assert _advised_mappings("bounded-after", NUMPY_MADVISE_HUGEPAGE="1") > 0   # the caller's choice wins


# Buffers of 2 MiB (under the mmap threshold: from the heap) made and freed in turn, as a model's
# steps do; prints the page faults of the last 50 after a warm-up.
_REFAULTS = """
import resource, sys
from omni_backend import glibc_heaps
if sys.argv[1] == "mallopt":
    glibc_heaps.bound_malloc_retention()
import numpy as np
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    np.ones(1 << 18).sum()
before = faults()
for _ in range(50):
    np.ones(1 << 18).sum()
print(faults() - before)
"""


@pytest.mark.parametrize("how", ["tunables", "mallopt"])
def test_freed_buffers_under_the_mmap_threshold_are_not_faulted_in_again(how: str) -> None:
    """A fixed mmap threshold also fixes glibc's trim threshold at 128 KiB: every freed buffer at
    a heap's top went back to the OS and the next one was faulted in again, page by page (a model
    step's tensors: 1,179 faults per first audio of the small random Qwen3-TTS). Set either way,
    the bounds keep up to LARGE_BUFFER_BYTES at the top."""
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if how == "tunables":
        env["GLIBC_TUNABLES"] = glibc_heaps.stub_tunables({})
    done = subprocess.run([sys.executable, "-c", _REFAULTS, how], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    faults = int(done.stdout.split()[-1])
    assert faults < 50, f"{faults} page faults for 50 buffers of 2 MiB made and freed in turn (512 pages each)"
