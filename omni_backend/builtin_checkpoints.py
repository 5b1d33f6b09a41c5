"""Built-in checkpoints (``builtin:<name>``): folders a family writes on first use, once per host.

Families declare their built-ins (tiny random weights, so a pipeline runs out of the box) and
resolve them here. A folder is written once, deterministically, and shared by every process that
needs it (entry, stages): the first writer wins under a file lock, the others reuse it.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

__all__ = ["builtin_name", "cache_root", "written_once"]


def cache_root() -> Path:
    return Path(os.environ.get("OMNI_CACHE_DIR", Path.home() / ".cache" / "omni-triton"))


def builtin_name(model: str, known: dict) -> str | None:
    """The built-in a `builtin:<name>` model names (None for a path); an unknown one is an error."""
    if not model.startswith("builtin:"):
        return None
    name = model.split(":", 1)[1]
    if name not in known:
        raise ValueError(f"unknown built-in checkpoint {model!r}; known: {', '.join('builtin:' + n for n in known)}")
    return name


def written_once(name: str, version: str, write: Callable[[Path], None]) -> str:
    """The folder ``<cache>/<name>-<version>``, written by ``write(folder)`` if it is not there yet."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{name}-{version}"
    if (target / ".complete").exists():
        return str(target)
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / ".complete").exists():
            tmp = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
            write(tmp)
            (tmp / ".complete").write_text("random weights: speaks noise\n")
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
    return str(target)
