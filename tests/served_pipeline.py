"""A real tritonserver for the length of a fixture, stopped on exit also when the code inside
fails: on a repository the test made (`running`), or on pipelines built from their deploy YAMLs
(`served`)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from client.triton_process import TritonProcess
from ensemble_builder.build import build


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
