"""Fixtures of the streaming-text tests (text that arrives while a request runs), loaded as a
plugin (`pytest_plugins = ["tests.system.streaming_text_fixtures"]`): one tritonserver serving the
tiny Qwen3-TTS pipeline (built here with a short `text_wait_s`, so the wait bound can be seen) and
hibari, and a speech API in front of it."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from client.speech_api.process import ShimProcess
from client.triton_process import TritonProcess

ROOT = Path(__file__).resolve().parents[2]
QWEN = "qwen3_tts_tiny_random"
TEXT_WAIT_S = 4.0
GREEDY = {"do_sample": False, "subtalker_do_sample": False}


@pytest.fixture(scope="session")
def text_triton(tmp_path_factory, fresh_builtin_checkpoints):
    from ensemble_builder.build import build

    base = tmp_path_factory.mktemp("text_triton")
    repo = base / "model_repository"
    deploy = yaml.safe_load((ROOT / "deploy" / f"{QWEN}.yaml").read_text())
    deploy["stages"][0].setdefault("options", {})["text_wait_s"] = TEXT_WAIT_S
    (base / "deploy.yaml").write_text(yaml.safe_dump(deploy))
    build(QWEN, repo, base / "deploy.yaml")
    for model in ("hibari", "hibari__synthesizer"):
        shutil.copytree(ROOT / "model_repository" / model, repo / model, ignore=shutil.ignore_patterns("__pycache__"))
    server = TritonProcess(repo, log_path=base / "tritonserver.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def text_shim(text_triton, tmp_path_factory):
    log = tmp_path_factory.mktemp("text_shim") / "shim.log"
    server = ShimProcess([text_triton.grpc_url], log_path=log,
                         extra_args=["--ws-idle-timeout", "3", "--ws-max-session-s", "120", "--ws-send-timeout", "2"])
    server.start()
    try:
        yield server
    finally:
        server.stop()
