"""tritonserver runs with the library that gives its free heap pages back (the stubs, which do it
from Python, and their children do not get it)."""
from __future__ import annotations

from pathlib import Path

import pytest

from omni_backend import glibc_heaps
from omni_backend.supervisor import stubs

pytestmark = pytest.mark.system


def threads(pid: int) -> list[str]:
    return [(task / "comm").read_text().strip() for task in Path(f"/proc/{pid}/task").iterdir()]


def environment(pid: int) -> dict[str, str]:
    pairs = (item.partition(b"=") for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if item)
    return {k.decode(): v.decode(errors="replace") for k, _, v in pairs}


def test_the_server_releases_its_free_pages_and_its_stubs_do_not_inherit_it(triton):
    pid = triton.server_pid
    assert pid is not None
    assert glibc_heaps.RELEASE_LIBRARY in Path(f"/proc/{pid}/maps").read_text()
    assert "release-freemem" in threads(pid)
    # the environment it was started with names the library; the one it passed on does not
    assert glibc_heaps.RELEASE_LIBRARY in environment(pid).get("LD_PRELOAD", "")
    found = stubs.stubs_of(pid)
    assert found
    for stub in found:
        assert glibc_heaps.RELEASE_LIBRARY not in Path(f"/proc/{stub.pid}/maps").read_text(), stub.model
        assert glibc_heaps.RELEASE_LIBRARY not in environment(stub.pid).get("LD_PRELOAD", ""), stub.model
