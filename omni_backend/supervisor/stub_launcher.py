"""The Python backend's stub, started through a launcher that gives the stubs their own glibc tunables.

tritonserver starts each stub as `bash -c "exec <backend>/python/triton_python_backend_stub <args>"`
with its own environment, so a stub would inherit tritonserver's `GLIBC_TUNABLES`; a stub's heap
wants other bounds (`glibc_heaps.stub_tunables`: a 4 MiB trim threshold, which tritonserver,
never trimmed, must not have). The launcher, installed under
the stub's name, sets `GLIBC_TUNABLES` from `$OMNI_STUB_GLIBC_TUNABLES` (`server_binary.server_env`
puts `glibc_heaps.stub_tunables` there) and executes the real stub in its place: same pid, same
parent, and `argv[0]` still the stub's name, so the supervisor and the orphan guard see a stub as
before. Without that variable (a server started some other way) the stub keeps tritonserver's.
"""
from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from omni_backend.glibc_heaps import STUB_TUNABLES_ENV
from omni_backend.stubs.server_stubs import STUB_NAME

REAL_STUB_NAME = STUB_NAME + ".bin"
# `exec -a "$0"` keeps the name tritonserver started it by as argv[0] (supervisor: `Stub`).
LAUNCHER = f"""#!/bin/bash
# omni-triton stub launcher (omni_backend/supervisor/stub_launcher.py): the stubs' own glibc tunables
if [ -n "${{{STUB_TUNABLES_ENV}+set}}" ]; then
  export GLIBC_TUNABLES="${{{STUB_TUNABLES_ENV}}}"
  unset {STUB_TUNABLES_ENV}
fi
exec -a "$0" "$(dirname "$0")/{REAL_STUB_NAME}" "$@"
"""


def write_atomically(path: Path, write) -> None:
    """Make `path` by `write(tmp)` into a file of its own, then rename it over `path`; the temporary
    file is gone either way."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def copy_atomically(src: Path, dst: Path) -> None:
    """Copy `src` to `dst` through a file of its own renamed over `dst`. Servers (and test workers)
    may assemble the backend folder at the same time, or while another server runs from it: a
    reader sees the old file or the new one, never half of one, and a loaded library keeps its
    own pages."""
    write_atomically(dst, lambda tmp: shutil.copy2(src, tmp))


def installed(python_dir: Path) -> bool:
    """Whether `python_dir` has the real stub and this launcher under the stub's name."""
    launcher = python_dir / STUB_NAME
    try:
        return (python_dir / REAL_STUB_NAME).is_file() and launcher.read_text() == LAUNCHER
    except (OSError, UnicodeDecodeError):   # the binary stub of an older folder
        return False


def install(python_dir: Path, real_stub: Path) -> None:
    """Put `real_stub` in `python_dir` as `REAL_STUB_NAME` and the launcher as `STUB_NAME`."""
    python_dir.mkdir(parents=True, exist_ok=True)
    copy_atomically(real_stub, python_dir / REAL_STUB_NAME)

    def write_launcher(tmp: Path) -> None:
        tmp.write_text(LAUNCHER)
        tmp.chmod(0o755)
    write_atomically(python_dir / STUB_NAME, write_launcher)
