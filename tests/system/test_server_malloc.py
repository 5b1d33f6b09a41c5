"""`OMNI_TRITON_ALLOCATOR=jemalloc`: the served tritonserver runs on jemalloc, keeps its name, and
serves; the Python stubs it starts keep glibc's malloc."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from client.triton_process import TritonProcess
from client.triton_stream import synthesize
from omni_backend.stubs import server_stubs as stubs
from omni_backend.supervisor import server_malloc

ROOT = Path(__file__).resolve().parents[2]


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.fixture
def jemalloc_server(tmp_path, monkeypatch):
    monkeypatch.setenv(server_malloc.ALLOCATOR_ENV, "jemalloc")
    repo = tmp_path / "model_repository"
    for model in ("hibari", "hibari__synthesizer"):
        shutil.copytree(ROOT / "model_repository" / model, repo / model,
                        ignore=shutil.ignore_patterns("__pycache__"))
    server = TritonProcess(repo, log_path=tmp_path / "tritonserver.log").start(timeout_s=300)
    try:
        yield server
    finally:
        server.stop()


def test_tritonserver_on_jemalloc_serves_and_its_stubs_keep_glibc(jemalloc_server) -> None:
    pid = jemalloc_server.server_pid
    assert pid is not None
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "tritonserver"
    assert "libjemalloc" in _maps(pid)
    children = stubs.stubs_of(pid)
    assert {s.model for s in children} == {"hibari", "hibari__synthesizer"}
    for stub in children:
        assert "libjemalloc" not in _maps(stub.pid), stub.model
        assert b"LD_PRELOAD=" not in Path(f"/proc/{stub.pid}/environ").read_bytes(), stub.model
    res = synthesize(jemalloc_server.grpc_url, "hibari", "Served on jemalloc. Two sentences.")
    assert len(res.chunks) == 2 and res.audio.size > 0
