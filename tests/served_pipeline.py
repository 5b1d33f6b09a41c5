"""A real tritonserver for the length of a fixture, stopped on exit also when the code inside
fails: on a repository the test made (`running`), or on pipelines built from their deploy YAMLs
(`served`)."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from client.triton_process import TritonProcess
from ensemble_builder.build import build
from omni_backend.stubs import server_stubs as stubs


@contextlib.contextmanager
def running(repo: Path, log_path: Path, *, start_timeout_s: float = 180.0,
            **process: Any) -> Iterator[TritonProcess]:
    """A tritonserver on `repo` (`process`: TritonProcess's other arguments), started and stopped."""
    server = TritonProcess(repo, log_path=log_path, **process)
    server.start(timeout_s=start_timeout_s)
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def served(deploys: Mapping[str, str | Path], workdir: Path, **process: Any) -> Iterator[TritonProcess]:
    """Each pipeline of `deploys` built from its deploy YAML into `workdir`/model_repository (one
    repository for all; it may hold models already), served with its log in
    `workdir`/tritonserver.log."""
    repo = workdir / "model_repository"
    for pipeline, deploy in deploys.items():
        build(pipeline, repo, deploy)
    with running(repo, workdir / "tritonserver.log", **process) as server:
        yield server


def shm_regions() -> set[str]:
    """The Python backend's shared-memory regions on the host now."""
    return {p.name for p in stubs.SHM_DIR.glob(f"{stubs.SHM_PREFIX}*")}


def regions_left_behind(before: set[str], settle_s: float = 10.0) -> list[str]:
    """Regions made since `before` that no process maps and that stay. Another server on the host
    (a test on the other worker) maps a region it made a moment after making it, and its
    supervisor removes what a killed tritonserver left a moment after the kill: such a region is
    mapped or gone within `settle_s`; one this test's server left stays."""
    deadline = time.monotonic() + settle_s
    while True:
        left = shm_regions() - before - stubs.mapped_regions()
        if not left or time.monotonic() > deadline:
            return sorted(left)
        time.sleep(0.2)
