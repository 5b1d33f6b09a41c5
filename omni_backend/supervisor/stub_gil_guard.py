"""The stubs' GIL guard: a small library, preloaded into every Python-backend stub, that frees
under the GIL the Python objects the 2.51 stub frees on its message thread without it
(stub_gil_guard.c says how and why).

It is compiled from its C source, once per version of that source, into this environment's
`share/omni-triton`, with the C compiler of the machine (`$CC`, else `cc` or `gcc`), and put first
in tritonserver's `LD_PRELOAD` (`server_binary.server_env`): every stub inherits it, whichever
backend folder it comes from (the NGC container's too). tritonserver itself never calls into
Python, so there it does nothing. Without a compiler the stubs run unguarded, as before, and the
server says so. `OMNI_STUB_GIL_GUARD=0` starts them without it.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from omni_backend.supervisor import stub_launcher

logger = logging.getLogger("omni.supervisor")

SOURCE = Path(__file__).with_name("stub_gil_guard.c")
FOLDER = Path(sys.prefix) / "share" / "omni-triton"
SWITCH_ENV = "OMNI_STUB_GIL_GUARD"
_SWITCH_VALUES = ("0", "1")


def library_name() -> str:
    """The library's file name: a new one for every version of the source."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    return f"libomni_stub_gil_guard-{digest}.so"


def check_switch(env: dict[str, str]) -> None:
    """Reject a value of `OMNI_STUB_GIL_GUARD` other than 0 or 1 (SystemExit naming it)."""
    value = env.get(SWITCH_ENV)
    if value is not None and value not in _SWITCH_VALUES:
        raise SystemExit(f"{SWITCH_ENV}={value!r}: must be 0 (stubs without the GIL guard) or 1 (the default)")


class _CompileError(Exception):
    pass


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build(folder: Path) -> Path | None:
    """The guard library in `folder`, compiled there unless this version is there already; None
    (with a warning) where there is no C compiler or it fails."""
    out = folder / library_name()
    if out.is_file():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    cc = _compiler()
    if cc is None:
        logger.warning("no C compiler (cc, gcc or $CC): the Python-backend stubs run without the GIL "
                       "guard (%s)", SOURCE.name)
        return None

    def compile_into(tmp: Path) -> None:
        done = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(tmp), str(SOURCE), "-pthread", "-ldl"],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise _CompileError(done.stderr.strip())
    try:
        # renamed over the final name: test workers may build the folder at once
        stub_launcher.write_atomically(out, compile_into)
    except _CompileError as exc:
        logger.warning("%s failed to compile the stubs' GIL guard; the stubs run without it:\n%s", cc, exc)
        return None
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("could not compile the stubs' GIL guard (%s); the stubs run without it", exc)
        return None
    return out


def preload(env: dict[str, str]) -> None:
    """Put the guard first in `env`'s LD_PRELOAD (compiled first where needed), unless
    `OMNI_STUB_GIL_GUARD=0` or it is there already; a value other than 0 or 1 is refused."""
    check_switch(env)
    if env.get(SWITCH_ENV) == "0":
        return
    library = build(FOLDER)
    if library is None:
        return
    given = [item for item in env.get("LD_PRELOAD", "").replace(" ", ":").split(":") if item]
    if str(library) not in given:
        env["LD_PRELOAD"] = ":".join([str(library), *given])
