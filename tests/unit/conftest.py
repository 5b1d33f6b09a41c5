"""Fixtures shared by unit tests."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid

import pytest

from omni_backend.stubs import server_stubs as stubs
from tests.requirement import require


@pytest.fixture
def fake_stub(tmp_path):
    """A process whose command line looks like a Python-backend stub's (a program that waits)."""
    exe = tmp_path / stubs.STUB_NAME
    source = tmp_path / "stub.c"
    source.write_text("#include <unistd.h>\nint main(void) { pause(); return 0; }\n")
    require(shutil.which("cc") is not None, "no C compiler (cc) to build a fake stub (apt-get install gcc)")
    assert subprocess.run(["cc", str(source), "-o", str(exe)]).returncode == 0, "cc failed on a 3-line program"
    region = f"{stubs.SHM_PREFIX}{uuid.uuid4()}"
    model_file = tmp_path / "repo" / "talker" / "1" / "model.py"
    # the 2.51 stub's arguments: model file, region, default and growth sizes, parent pid,
    # libpython, IPC handle, instance name, runtime folder
    proc = subprocess.Popen([str(exe), str(model_file), region, "1048576", "1048576", str(os.getpid()),
                             "/usr/lib", "1234", "talker_0_0", str(tmp_path)])
    time.sleep(0.2)
    try:
        yield proc, model_file, region
    finally:
        proc.kill()
        proc.wait()
