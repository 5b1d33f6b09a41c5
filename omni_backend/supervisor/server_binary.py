"""Run the `tritonserver` binary that ships in the nvidia-pytriton wheel.

The wheel carries the server, the Python backend and one backend stub per Python version. The
stub must match the interpreter that runs the models, so we assemble a backend directory for this
interpreter once and pass it with --backend-directory. In the NGC container the real
/opt/tritonserver is used instead (see the Dockerfile).
"""
from __future__ import annotations

import importlib.metadata
import os
import sys
import sysconfig
from pathlib import Path

from omni_backend import glibc_heaps
from omni_backend.deploy import PYTHON_BACKEND_THREADS
from omni_backend.supervisor import server_malloc, stub_gil_guard, stub_launcher


def _pytriton_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("nvidia-pytriton is not installed: run `make setup`")
    return Path(list(spec.submodule_search_locations)[0]) / "tritonserver"


def check_numpy() -> None:
    """Refuse numpy >= 2 in the interpreter that runs the models: the 2.51 Python backend stub then
    mis-reads every BYTES input tensor (`deserialize_bytes_tensor` reads a length of 0x08080808
    from a 12-byte text) and aborts, so each request would kill the stage it reaches."""
    try:
        version = importlib.metadata.version("numpy")
    except importlib.metadata.PackageNotFoundError:
        return   # the models' own import fails, with its own message
    if int(version.split(".")[0]) >= 2:
        raise SystemExit(f"numpy {version} is installed for {sys.executable}: Triton 2.51's Python backend "
                         "stub aborts on every text (BYTES) input under numpy 2; install numpy<2 "
                         "(the project pins numpy==1.26.4)")


def binary_path() -> Path:
    """The tritonserver executable: $TRITONSERVER_BIN, the NGC install, or the wheel's."""
    env = os.environ.get("TRITONSERVER_BIN")
    if env:
        return Path(env)
    ngc = Path("/opt/tritonserver/bin/tritonserver")
    if ngc.exists():
        return ngc
    return _pytriton_root() / "bin" / "tritonserver"


def backend_directory() -> Path:
    """A backends folder whose python backend has the stub for this interpreter, started through
    `stub_launcher` (the stubs' own glibc tunables). The NGC container's own folder is used as it
    is: its stubs keep tritonserver's tunables."""
    ngc = Path("/opt/tritonserver/backends")
    if ngc.exists() and not os.environ.get("TRITONSERVER_BIN"):
        return ngc
    root = _pytriton_root()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    target = Path(sys.prefix) / "share" / "omni-triton" / f"backends-py{version}"
    python_dir = target / "python"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise SystemExit(f"no Triton Python backend stub for Python {version} in {stub.parent.parent}")
    if not stub_launcher.installed(python_dir):
        python_dir.mkdir(parents=True, exist_ok=True)
        for src in (root / "backends" / "python").iterdir():
            if src.is_file() and src.name != stub_launcher.STUB_NAME:
                stub_launcher.copy_atomically(src, python_dir / src.name)
        stub_launcher.install(python_dir, stub)
    return target


def server_env() -> dict[str, str]:
    """The environment the server needs: this venv first on PATH so model.py imports resolve."""
    env = dict(os.environ)
    env["VIRTUAL_ENV"] = sys.prefix
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # The stub copied into our backend folder loses its relative RPATH to the wheel's bundled
    # libraries, and must link the libpython of the interpreter that runs the models.
    libs = [str(_pytriton_root().parent.parent / "nvidia_pytriton.libs"),
            sysconfig.get_config_var("LIBDIR") or ""]
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = os.pathsep.join(x for x in libs if x)
    # bounded glibc heaps for the stubs (their launcher sets theirs), and for tritonserver unless it
    # runs on jemalloc. The stubs' are kept where set: a user's own, or the first call's (the
    # supervisor's own call sees the server's tunables, not the user's, in its environment).
    env.setdefault(glibc_heaps.STUB_TUNABLES_ENV, glibc_heaps.stub_tunables(env))
    stub_gil_guard.preload(env)   # the stubs inherit it
    env["GLIBC_TUNABLES"] = glibc_heaps.tunables(env)
    if server_malloc.choice(env) == "jemalloc":
        env["MALLOC_CONF"] = server_malloc.conf(env)
    return env


# Flags by which a caller decides auto-completion itself (`--strict-model-config=false` asks for it).
_AUTO_COMPLETE_FLAGS = ("--disable-auto-complete-config", "--strict-model-config")


def command(args: list[str]) -> list[str]:
    """Full argv for tritonserver (through the loader with jemalloc where OMNI_TRITON_ALLOCATOR asks
    for it) with our backend directory unless the caller gave one, and auto-completion off.

    The builder writes every config.pbtxt whole, so auto-completion has nothing to add, but the 2.51
    Python backend runs it by starting a second stub per model (importing model.py) and stopping it,
    taking the stub's health mutex with no time-out: one more Python process per model in every
    start and reload, and one more place where a stub that dies holding that robust mutex aborts
    tritonserver with `boost::interprocess::lock_exception` (perf/RESULTS.md)."""
    check_numpy()
    binary = str(binary_path())
    argv = [*server_malloc.preload_argv(binary), binary]
    if not any(a.startswith("--backend-directory") for a in args):
        argv.append(f"--backend-directory={backend_directory()}")
    if not any(a.startswith(flag) for a in args for flag in _AUTO_COMPLETE_FLAGS):
        argv.append("--disable-auto-complete-config")
    if not any(a.startswith("--backend-config=python,thread-pool-size=") for a in args):
        argv.append(f"--backend-config=python,thread-pool-size={PYTHON_BACKEND_THREADS}")
    return argv + list(args)


def main() -> None:
    """`omni-tritonserver ARGS...`: exec tritonserver, e.g. `omni-tritonserver --model-repository model_repository`."""
    argv = command(sys.argv[1:])
    os.execve(argv[0], argv, server_env())


if __name__ == "__main__":
    main()
