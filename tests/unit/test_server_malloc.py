"""tritonserver's allocator: jemalloc preloaded through the loader, for the server alone."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from omni_backend.supervisor import server_binary, server_malloc


def _jemalloc_here() -> bool:
    try:
        return bool(server_malloc.preload_argv(sys.executable, {server_malloc.ALLOCATOR_ENV: "jemalloc"}))
    except SystemExit:
        return False


JEMALLOC_HERE = _jemalloc_here()
ASK_JEMALLOC = {server_malloc.ALLOCATOR_ENV: "jemalloc"}


def test_the_loader_a_program_names_is_read_from_its_elf_header() -> None:
    loader = server_malloc.elf_interpreter(sys.executable)
    assert loader and Path(loader).exists()
    assert Path(loader).name.startswith("ld-")


def test_a_file_that_is_not_an_elf_program_names_no_loader(tmp_path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    assert server_malloc.elf_interpreter(script) is None


def test_an_unknown_allocator_is_rejected_by_name() -> None:
    with pytest.raises(SystemExit, match=f"{server_malloc.ALLOCATOR_ENV}='tcmalloc'"):
        server_malloc.preload_argv(sys.executable, {server_malloc.ALLOCATOR_ENV: "tcmalloc"})


@pytest.mark.parametrize("asked", ["glibc", None])
def test_glibc_asked_for_or_by_default_runs_the_binary_itself(monkeypatch, asked) -> None:
    if asked:
        monkeypatch.setenv(server_malloc.ALLOCATOR_ENV, asked)
    else:
        monkeypatch.delenv(server_malloc.ALLOCATOR_ENV, raising=False)
    monkeypatch.delenv("MALLOC_CONF", raising=False)
    argv = server_binary.command(["--model-repository=/r"])
    assert argv[0] == str(server_binary.binary_path())
    assert "MALLOC_CONF" not in server_binary.server_env()


def test_jemalloc_asked_for_but_missing_is_an_error(monkeypatch) -> None:
    monkeypatch.setattr(server_malloc.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(SystemExit, match="libjemalloc2"):
        server_malloc.preload_argv(sys.executable, ASK_JEMALLOC)


def test_jemalloc_asked_for_where_the_link_cannot_be_made_is_an_error(monkeypatch) -> None:
    monkeypatch.setattr(server_malloc.ctypes.util, "find_library", lambda name: "libjemalloc.so.2")

    def read_only(loader: str) -> Path:
        raise PermissionError(13, "Permission denied", "/venv/share/omni-triton/loader")
    monkeypatch.setattr(server_malloc, "_named_loader", read_only)
    with pytest.raises(SystemExit, match="Permission denied"):
        server_malloc.preload_argv(sys.executable, ASK_JEMALLOC)


@pytest.mark.skipif(not JEMALLOC_HERE, reason="jemalloc is not installed here")
def test_the_server_runs_through_a_loader_named_tritonserver(monkeypatch) -> None:
    monkeypatch.setenv(server_malloc.ALLOCATOR_ENV, "jemalloc")
    monkeypatch.delenv("MALLOC_CONF", raising=False)
    assert server_binary.server_env()["MALLOC_CONF"] == server_malloc.JEMALLOC_CONF
    binary = str(server_binary.binary_path())
    argv = server_binary.command(["--model-repository=/r"])
    link = Path(argv[0])
    assert link.name == "tritonserver" and link.is_symlink()
    assert os.readlink(link) == server_malloc.elf_interpreter(binary)
    assert argv[1:6] == ["--preload", argv[2], "--argv0", binary, binary] and "jemalloc" in argv[2]
    assert argv[-1] == "--model-repository=/r"


@pytest.mark.skipif(not JEMALLOC_HERE, reason="jemalloc is not installed here")
def test_a_preloaded_program_has_jemalloc_and_its_children_do_not() -> None:
    # the loader's --preload reaches the program alone: a child it starts keeps glibc's malloc
    prefix = server_malloc.preload_argv(sys.executable, ASK_JEMALLOC)
    code = ("import subprocess, sys; print('jemalloc' in open('/proc/self/maps').read()); sys.stdout.flush(); "
            "subprocess.run([sys.executable, '-c', \"print('jemalloc' in open('/proc/self/maps').read())\"])")
    out = subprocess.run([*prefix, sys.executable, "-c", code],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "False"]


def test_a_users_malloc_conf_comes_after_ours_so_it_wins() -> None:
    assert server_malloc.conf({}) == server_malloc.JEMALLOC_CONF
    assert server_malloc.conf({"MALLOC_CONF": "narenas:4"}) == f"{server_malloc.JEMALLOC_CONF},narenas:4"


def test_malloc_conf_is_ours_then_the_users_once_however_often_it_is_made() -> None:
    once = server_malloc.conf({"MALLOC_CONF": "junk:true"})
    assert once == f"{server_malloc.JEMALLOC_CONF},junk:true"
    assert server_malloc.conf({"MALLOC_CONF": once}) == once   # the supervisor's env, made again
    assert server_malloc.conf({}) == server_malloc.JEMALLOC_CONF
    assert server_malloc.conf({"MALLOC_CONF": server_malloc.JEMALLOC_CONF}) == server_malloc.JEMALLOC_CONF
