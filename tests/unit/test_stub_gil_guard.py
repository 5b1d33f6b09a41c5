"""The stubs' GIL guard on its own: an object whose last reference a thread without the GIL drops
is freed by the guard's thread, under the GIL; one dropped with the GIL is freed at once, where it
was dropped. Plus how the library is built, preloaded and switched off."""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from omni_backend.supervisor import stub_gil_guard, stub_launcher

# Runs in a python with the guard preloaded. `_Py_Dealloc` called through ctypes.CDLL runs
# without the GIL (CDLL releases it), through ctypes.PyDLL with it: as the stub's message thread
# and the stub's Python threads call it. The object's count is set to 0 first, as a Py_DECREF
# that dropped the last reference leaves it.
PROBE = textwrap.dedent('''
    import ctypes, sys, threading, time, weakref
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
    with caplog.at_level(logging.WARNING, logger="omni.supervisor"):
        assert stub_gil_guard.build(tmp_path) is None
    assert "GIL guard" in caplog.text
    assert not any(tmp_path.iterdir())
    # the folder is not taken as installed, so the next start tries again
    stub_launcher.install(tmp_path, Path(shutil.which("sleep")))
    assert not stub_launcher.installed(tmp_path)


def test_a_compile_error_is_reported_with_the_compilers_words(tmp_path, monkeypatch, caplog) -> None:
    broken = tmp_path / "broken.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(stub_gil_guard, "SOURCE", broken)
    with caplog.at_level(logging.WARNING, logger="omni.supervisor"):
        assert stub_gil_guard.build(tmp_path) is None
    assert "failed to compile" in caplog.text and "error" in caplog.text


def _preloaded(python_dir: Path, env: dict[str, str]) -> str:
    """LD_PRELOAD of a stand-in stub started as tritonserver starts a stub."""
    stub = python_dir / stub_launcher.STUB_NAME
    done = subprocess.run(["bash", "-c", f"exec {stub}"], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return next((line.split("=", 1)[1] for line in done.stdout.splitlines() if line.startswith("LD_PRELOAD=")), "")


def test_the_launcher_preloads_the_guard_before_a_preload_of_the_servers_unless_switched_off(tmp_path) -> None:
    # the stand-in stub prints its environment
    stub_launcher.install(tmp_path, Path(shutil.which("env")))
    assert stub_launcher.installed(tmp_path)
    guard = str(tmp_path / stub_gil_guard.library_name())
    base = {"PATH": "/usr/bin:/bin"}
    assert _preloaded(tmp_path, base) == guard
    assert _preloaded(tmp_path, {**base, "LD_PRELOAD": "libother.so"}) == f"{guard}:libother.so"
    assert _preloaded(tmp_path, {**base, stub_gil_guard.SWITCH_ENV: "1"}) == guard
    assert _preloaded(tmp_path, {**base, stub_gil_guard.SWITCH_ENV: "0"}) == ""


def test_only_0_and_1_switch_the_guard() -> None:
    for value in ("0", "1"):
        stub_gil_guard.check_switch({stub_gil_guard.SWITCH_ENV: value})
    stub_gil_guard.check_switch({})
    with pytest.raises(SystemExit, match="OMNI_STUB_GIL_GUARD='no'"):
        stub_gil_guard.check_switch({stub_gil_guard.SWITCH_ENV: "no"})
