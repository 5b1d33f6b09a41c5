"""The stub launcher: tritonserver's `bash -c "exec <stub> <args>"` starts the real stub in the same
process, under the stub's name, with the stubs' own glibc tunables."""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from omni_backend import glibc_heaps
from omni_backend.stubs import server_stubs
from omni_backend.supervisor import server_binary, stub_launcher

SERVER = "glibc.malloc.arena_max=2:glibc.malloc.tcache_count=0"
STUBS = "glibc.malloc.arena_max=2:glibc.malloc.trim_threshold=4194304"


def _environ(pid: int) -> list[str]:
    # the loader cuts the variable at each ':' in the process's initial environment (what it
    # parsed), so its settings are entries of their own there
    return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")


def _start_as_tritonserver_does(python_dir: Path, env: dict[str, str]) -> subprocess.Popen:
    stub = python_dir / stub_launcher.STUB_NAME
    proc = subprocess.Popen(["bash", "-c", f"exec {stub} 30"], env=env)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{proc.pid}/exe").resolve().name != stub_launcher.REAL_STUB_NAME:
        assert time.monotonic() < deadline and proc.poll() is None, "the real stub never started"
        time.sleep(0.02)
    return proc


def test_the_real_stub_runs_in_the_launchers_place_with_the_stubs_tunables(tmp_path) -> None:
    # a stand-in for the real stub: a program that stays up, so its process can be read
    stub_launcher.install(tmp_path, Path(shutil.which("sleep")))
    assert stub_launcher.installed(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "GLIBC_TUNABLES": SERVER, glibc_heaps.STUB_TUNABLES_ENV: STUBS}
    proc = _start_as_tritonserver_does(tmp_path, env)
    try:
        argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert argv[0].decode().endswith(server_stubs.STUB_NAME) and argv[1] == b"30"   # as the supervisor reads it
        environ = _environ(proc.pid)
        assert "GLIBC_TUNABLES=glibc.malloc.arena_max=2" in environ and "glibc.malloc.trim_threshold=4194304" in environ
        assert "glibc.malloc.tcache_count=0" not in environ
        assert not any(e.startswith(glibc_heaps.STUB_TUNABLES_ENV) for e in environ)
    finally:
        proc.kill()
        proc.wait()


def test_without_the_stubs_tunables_a_stub_keeps_the_servers(tmp_path) -> None:
    stub_launcher.install(tmp_path, Path(shutil.which("sleep")))
    proc = _start_as_tritonserver_does(tmp_path, {"PATH": "/usr/bin:/bin", "GLIBC_TUNABLES": SERVER})
    try:
        assert "glibc.malloc.tcache_count=0" in _environ(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_a_folder_with_the_binary_stub_under_its_name_is_not_taken_as_installed(tmp_path) -> None:
    shutil.copy2(shutil.which("sleep"), tmp_path / stub_launcher.STUB_NAME)
    assert not stub_launcher.installed(tmp_path)
    stub_launcher.install(tmp_path, Path(shutil.which("sleep")))
    assert stub_launcher.installed(tmp_path)


def test_the_stubs_keep_freed_memory_at_their_heaps_top_and_the_server_does_not(monkeypatch) -> None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv(glibc_heaps.STUB_TUNABLES_ENV, raising=False)
    env = server_binary.server_env()
    server = env["GLIBC_TUNABLES"].split(":")
    stubs = env[glibc_heaps.STUB_TUNABLES_ENV].split(":")
    trim = f"glibc.malloc.trim_threshold={glibc_heaps.LARGE_BUFFER_BYTES}"
    assert trim in stubs and trim not in server
    assert set(stubs) - set(server) == {trim}   # the other bounds are the same
    assert set(server) - set(stubs) == {f"glibc.malloc.tcache_count={glibc_heaps.THREAD_CACHE_CHUNKS}"}
    # the supervisor computes the environment again inside an environment made by it: the
    # stubs' tunables still come from the user's, not from the server's
    monkeypatch.setenv("GLIBC_TUNABLES", env["GLIBC_TUNABLES"])
    monkeypatch.setenv(glibc_heaps.STUB_TUNABLES_ENV, env[glibc_heaps.STUB_TUNABLES_ENV])
    assert server_binary.server_env()[glibc_heaps.STUB_TUNABLES_ENV] == env[glibc_heaps.STUB_TUNABLES_ENV]


def test_a_users_own_stub_tunables_win_whole(monkeypatch) -> None:
    # e.g. without glibc's per-thread cache in the stubs (on by default, glibc_heaps.stub_tunables)
    mine = "glibc.malloc.arena_max=2:glibc.malloc.trim_threshold=4194304:glibc.malloc.tcache_count=0"
    monkeypatch.setenv(glibc_heaps.STUB_TUNABLES_ENV, mine)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    env = server_binary.server_env()
    assert env[glibc_heaps.STUB_TUNABLES_ENV] == mine
    assert "glibc.malloc.tcache_count=0" in env["GLIBC_TUNABLES"].split(":")


def test_a_users_own_glibc_tunables_reach_the_stubs(monkeypatch) -> None:
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=3")
    monkeypatch.delenv(glibc_heaps.STUB_TUNABLES_ENV, raising=False)
    env = server_binary.server_env()
    assert "glibc.malloc.tcache_count=3" in env[glibc_heaps.STUB_TUNABLES_ENV].split(":")
    assert "glibc.malloc.tcache_count=3" in env["GLIBC_TUNABLES"].split(":")
