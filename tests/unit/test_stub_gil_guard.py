"""The stubs' GIL guard on its own: an object whose last reference a thread without the GIL drops
is freed by the guard's thread, under the GIL; one dropped with the GIL is freed at once, where it
was dropped. Plus how the library is built, put in tritonserver's LD_PRELOAD and switched off."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from omni_backend.supervisor import server_binary, stub_gil_guard

# Runs in a python with the guard preloaded. `_Py_Dealloc` called through ctypes.CDLL runs
# without the GIL (CDLL releases it), through ctypes.PyDLL with it: as the stub's message thread
# and the stub's Python threads call it. The object's count is set to 0 first, as a Py_DECREF
# that dropped the last reference leaves it.
PROBE = textwrap.dedent('''
    import ctypes, os, sys, threading, time, weakref
    lib = sys.argv[1]
    without_gil, with_gil = ctypes.CDLL(lib), ctypes.PyDLL(lib)
    for f in (without_gil.omni_gil_guard_deferred, without_gil.omni_gil_guard_freed):
        f.restype = ctypes.c_ulong

    class Box:
        pass

    def drop_last_reference(dealloc):
        freed_by = []
        box = Box()
        ref = weakref.ref(box, lambda _: freed_by.append((threading.get_ident(), ctypes.pythonapi.PyGILState_Check())))
        address = id(box)
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(box))
        del box
        ctypes.c_ssize_t.from_address(address).value = 0
        dealloc._Py_Dealloc(ctypes.c_void_p(address))
        return freed_by, ref

    here = threading.get_ident()
    freed_by, ref = drop_last_reference(without_gil)
    deadline = time.monotonic() + 10
    while not freed_by and time.monotonic() < deadline:
        time.sleep(0.01)
    assert freed_by and ref() is None, "never freed"
    assert freed_by[0][0] != here and freed_by[0][1] == 1, freed_by
    assert (without_gil.omni_gil_guard_deferred(), without_gil.omni_gil_guard_freed()) == (1, 1)

    freed_by, ref = drop_last_reference(with_gil)
    assert freed_by == [(here, 1)] and ref() is None, freed_by
    assert without_gil.omni_gil_guard_deferred() == 1

    # a forked child (whose parent's freeing thread is not copied) frees them too
    pid = os.fork()
    if pid == 0:
        freed_by, ref = drop_last_reference(without_gil)
        deadline = time.monotonic() + 10
        while not freed_by and time.monotonic() < deadline:
            time.sleep(0.01)
        os._exit(0 if freed_by and freed_by[0][1] == 1 and without_gil.omni_gil_guard_freed() == 2 else 1)
    assert os.waitpid(pid, 0)[1] == 0, "the child never freed it"
    print("ok")
''')


@pytest.fixture(scope="module")
def guard(tmp_path_factory) -> Path:
    built = stub_gil_guard.build(tmp_path_factory.mktemp("guard"))
    assert built is not None and built.name == stub_gil_guard.library_name()
    return built


def test_an_object_dropped_without_the_gil_is_freed_later_by_a_thread_that_holds_it(guard) -> None:
    env = {**os.environ, "LD_PRELOAD": str(guard)}
    done = subprocess.run([sys.executable, "-c", PROBE, str(guard)], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_built_version_is_kept_and_a_new_source_gets_a_new_name(guard, monkeypatch, tmp_path) -> None:
    mtime = guard.stat().st_mtime_ns
    assert stub_gil_guard.build(guard.parent) == guard and guard.stat().st_mtime_ns == mtime
    changed = tmp_path / "stub_gil_guard.c"
    changed.write_text(stub_gil_guard.SOURCE.read_text() + "\n/* another version */\n")
    monkeypatch.setattr(stub_gil_guard, "SOURCE", changed)
    assert stub_gil_guard.library_name() != guard.name


def test_without_a_compiler_the_stubs_run_unguarded_and_it_is_said(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(stub_gil_guard, "FOLDER", tmp_path / "share")
    env = {"LD_PRELOAD": "libother.so"}
    with caplog.at_level(logging.WARNING, logger="omni.supervisor"):
        stub_gil_guard.preload(env)
    assert "GIL guard" in caplog.text
    assert env == {"LD_PRELOAD": "libother.so"}
    assert not any((tmp_path / "share").iterdir())


def test_a_compile_error_is_reported_with_the_compilers_words(tmp_path, monkeypatch, caplog) -> None:
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(stub_gil_guard, "SOURCE", broken)
    with caplog.at_level(logging.WARNING, logger="omni.supervisor"):
        assert stub_gil_guard.build(tmp_path) is None
    assert "failed to compile" in caplog.text and "error" in caplog.text


def test_the_server_preloads_the_guard_first_once_unless_switched_off(guard, monkeypatch) -> None:
    monkeypatch.setattr(stub_gil_guard, "FOLDER", guard.parent)
    for name in ("LD_PRELOAD", stub_gil_guard.SWITCH_ENV):
        monkeypatch.delenv(name, raising=False)
    assert server_binary.server_env()["LD_PRELOAD"] == str(guard)
    monkeypatch.setenv("LD_PRELOAD", "libother.so")
    env = server_binary.server_env()
    assert env["LD_PRELOAD"] == f"{guard}:libother.so"
    # the supervisor makes the environment again inside the first one's
    monkeypatch.setenv("LD_PRELOAD", env["LD_PRELOAD"])
    assert server_binary.server_env()["LD_PRELOAD"] == f"{guard}:libother.so"
    monkeypatch.setenv(stub_gil_guard.SWITCH_ENV, "0")
    monkeypatch.setenv("LD_PRELOAD", "libother.so")
    assert server_binary.server_env()["LD_PRELOAD"] == "libother.so"


def test_only_0_and_1_switch_the_guard() -> None:
    for value in ("0", "1"):
        stub_gil_guard.check_switch({stub_gil_guard.SWITCH_ENV: value})
    stub_gil_guard.check_switch({})
    with pytest.raises(SystemExit, match="OMNI_STUB_GIL_GUARD='no'"):
        stub_gil_guard.check_switch({stub_gil_guard.SWITCH_ENV: "no"})
