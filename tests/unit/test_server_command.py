"""The tritonserver command line the project runs: its backends, and auto-completion off."""
from __future__ import annotations

import pytest

from omni_backend.supervisor import server_binary


def test_auto_completion_is_off_by_default(monkeypatch) -> None:
    monkeypatch.delenv("OMNI_TRITON_ALLOCATOR", raising=False)
    argv = server_binary.command(["--model-repository=/r"])
    assert argv.count("--disable-auto-complete-config") == 1
    assert argv[-1] == "--model-repository=/r"
    assert any(a.startswith("--backend-directory=") for a in argv)


@pytest.mark.parametrize("flag", ["--disable-auto-complete-config", "--strict-model-config=false",
                                  "--strict-model-config=true"])
def test_a_callers_own_auto_completion_flag_is_kept_alone(monkeypatch, flag) -> None:
    monkeypatch.delenv("OMNI_TRITON_ALLOCATOR", raising=False)
    argv = server_binary.command(["--model-repository=/r", flag])
    assert argv.count(flag) == 1
    others = [a for a in argv if a != flag]
    assert not any(a.startswith(("--disable-auto-complete", "--strict-model-config")) for a in others)


def test_a_callers_backend_directory_is_kept(monkeypatch) -> None:
    monkeypatch.delenv("OMNI_TRITON_ALLOCATOR", raising=False)
    argv = server_binary.command(["--backend-directory=/b", "--model-repository=/r"])
    assert [a for a in argv if a.startswith("--backend-directory")] == ["--backend-directory=/b"]


def test_the_python_backend_gets_more_threads_than_an_entry_can_hold_in_bls_calls(monkeypatch) -> None:
    from omni_backend.deploy import MAX_BLS_THREADS, PYTHON_BACKEND_THREADS

    monkeypatch.delenv("OMNI_TRITON_ALLOCATOR", raising=False)
    argv = server_binary.command(["--model-repository=/r"])
    assert argv.count(f"--backend-config=python,thread-pool-size={PYTHON_BACKEND_THREADS}") == 1
    assert MAX_BLS_THREADS < PYTHON_BACKEND_THREADS
    own = "--backend-config=python,thread-pool-size=200"
    argv = server_binary.command(["--model-repository=/r", own])
    assert [a for a in argv if "thread-pool-size" in a] == [own]
