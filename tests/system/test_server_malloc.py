"""The served tritonserver runs on jemalloc; the Python stubs it starts keep glibc's malloc."""
from __future__ import annotations

from pathlib import Path

import pytest

from omni_backend.supervisor import stubs
from omni_backend.triton import server_binary, server_malloc

pytestmark = pytest.mark.skipif(not server_malloc.preload_argv(server_binary.binary_path(), {}),
                                reason="jemalloc is not installed here")


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_tritonserver_has_jemalloc_and_its_stubs_do_not(triton) -> None:
    pid = triton.server_pid
    assert pid is not None
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "tritonserver"
    assert "libjemalloc" in _maps(pid)
    children = stubs.stubs_of(pid)
    assert children
    for stub in children:
        assert "libjemalloc" not in _maps(stub.pid), stub.model
        assert b"LD_PRELOAD=" not in Path(f"/proc/{stub.pid}/environ").read_bytes(), stub.model
