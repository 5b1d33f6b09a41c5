"""Shared fixtures of the speech API system tests, loaded as a plugin by each test module
(`pytest_plugins = ["tests.system.speech_api_fixtures"]`) so the whole session shares one shim
process in front of the session's real tritonserver."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import pytest

from client.speech_api.process import ShimProcess
from client.triton_process import TritonProcess, free_port
from tests.served_pipeline import running
from tests.system.speech_api_helpers import hibari_repository


@contextlib.contextmanager
def served_stack(repo: Path, logs: Path) -> Iterator[tuple[TritonProcess, ShimProcess]]:
    """A tritonserver on `repo` and a speech API in front of it, both stopped on exit."""
    with running(repo, logs / "tritonserver.log") as server:
        shim = ShimProcess([server.grpc_url], log_path=logs / "shim.log")
        try:
            shim.start()
            yield server, shim
        finally:
            shim.stop()


@pytest.fixture(scope="session")
def shim(triton, tmp_path_factory):
    """One shim for most tests: no API keys, no stream limit, the session's Triton."""
    log = tmp_path_factory.mktemp("shim") / "shim.log"
    server = ShimProcess([triton.grpc_url], log_path=log)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def openai_client(shim):
    import openai
    return openai.OpenAI(base_url=f"{shim.url}/v1", api_key="not-needed", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def keyed_shim(triton, tmp_path_factory):
    """API keys from the environment and the flag, and a shim-side limit of one stream."""
    log = tmp_path_factory.mktemp("keyed_shim") / "shim.log"
    server = ShimProcess([triton.grpc_url], api_keys=["key-three"], log_path=log,
                         env={"OMNI_API_KEYS": "key-one, key-two"},
                         extra_args=["--max-streams-per-pipeline", "1"])
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def dead_shim(tmp_path_factory):
    """A shim whose only Triton address has nothing listening."""
    log = tmp_path_factory.mktemp("dead_shim") / "shim.log"
    server = ShimProcess([f"localhost:{free_port()}"], log_path=log, extra_args=["--probe-interval", "5"])
    server.start(need_healthy=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def busy_stack(tmp_path_factory):
    """A second tritonserver whose hibari entry takes one stream at a time (a copy of the
    committed hibari models with `max_streams: 1`), and a shim in front of it without a limit of
    its own: Triton's `unavailable: busy:` must come out as 429."""
    base = tmp_path_factory.mktemp("busy_triton")
    repo = hibari_repository(base / "model_repository")
    config = repo / "hibari" / "config.pbtxt"
    text = config.read_text()
    assert '\\"max_streams\\":64' in text
    config.write_text(text.replace('\\"max_streams\\":64', '\\"max_streams\\":1'))
    with served_stack(repo, base) as stack:
        yield stack
