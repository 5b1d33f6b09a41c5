"""`OMNI_TRITON_ALLOCATOR=jemalloc`: the served tritonserver runs on jemalloc, keeps its name, and
serves; the Python stubs it starts keep glibc's malloc."""
from __future__ import annotations

from pathlib import Path

import pytest

from client.triton_stream import synthesize
from omni_backend import glibc_heaps
from omni_backend.stubs import server_stubs as stubs
from omni_backend.supervisor import server_malloc, stub_gil_guard
from tests.served_pipeline import running
from tests.system.speech_api_helpers import hibari_repository


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.fixture
def jemalloc_server(tmp_path, monkeypatch):
    monkeypatch.setenv(server_malloc.ALLOCATOR_ENV, "jemalloc")
    repo = hibari_repository(tmp_path / "model_repository")
    with running(repo, tmp_path / "tritonserver.log", start_timeout_s=300) as server:
        yield server


def test_tritonserver_on_jemalloc_serves_and_its_stubs_keep_glibc(jemalloc_server) -> None:
    pid = jemalloc_server.server_pid
    assert pid is not None
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "tritonserver"
    assert "libjemalloc" in _maps(pid)
    children = stubs.stubs_of(pid)
    assert {s.model for s in children} == {"hibari", "hibari__synthesizer"}
    for stub in children:
        assert "libjemalloc" not in _maps(stub.pid), stub.model
        # the stubs preload their GIL guard only
        guard = stub_gil_guard.FOLDER / stub_gil_guard.library_name()
        preload = [e for e in Path(f"/proc/{stub.pid}/environ").read_bytes().split(b"\0") if e.startswith(b"LD_PRELOAD=")]
        assert preload == [f"LD_PRELOAD={guard}".encode()], stub.model
    res = synthesize(jemalloc_server.grpc_url, "hibari", "Served on jemalloc. Two sentences.")
    assert len(res.chunks) == 2 and res.audio.size > 0


def test_the_served_stubs_start_with_their_own_tunables(triton) -> None:
    """The stubs start through `stub_launcher` with their own tunables, a 4 MiB trim threshold and
    glibc's per-thread cache that tritonserver does not have (glibc reads them at start; the
    loader cuts the variable in a process's initial environment at each ':' it parsed)."""
    trim = f"glibc.malloc.trim_threshold={glibc_heaps.LARGE_BUFFER_BYTES}".encode()
    environ = lambda pid: Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert b"glibc.malloc.tcache_count=0" in environ(triton.server_pid)
    assert trim not in environ(triton.server_pid)
    children = stubs.stubs_of(triton.server_pid)
    assert children
    for stub in children:
        assert trim in environ(stub.pid), stub.model
        assert not any(e.startswith(b"glibc.malloc.tcache_count") for e in environ(stub.pid)), stub.model
        assert stub_gil_guard.library_name() in _maps(stub.pid), stub.model   # and their GIL guard
        assert not any(e.startswith(glibc_heaps.STUB_TUNABLES_ENV.encode()) for e in environ(stub.pid)), stub.model
