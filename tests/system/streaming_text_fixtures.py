"""Fixtures of the streaming-text tests (text that arrives while a request runs), loaded as a
plugin (`pytest_plugins = ["tests.system.streaming_text_fixtures"]`): one tritonserver serving the
tiny Qwen3-TTS pipeline (built here with a short `text_wait_s`, so the wait bound can be seen) and
hibari, and a speech API in front of it."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from client.speech_api.process import ShimProcess
from tests.served_pipeline import served
from tests.system.speech_api_helpers import hibari_repository

ROOT = Path(__file__).resolve().parents[2]
QWEN = "qwen3_tts_tiny_random"
TEXT_WAIT_S = 4.0
GREEDY = {"do_sample": False, "subtalker_do_sample": False}


@pytest.fixture(scope="session")
def text_triton(tmp_path_factory, fresh_builtin_checkpoints):
    base = tmp_path_factory.mktemp("text_triton")
    deploy = yaml.safe_load((ROOT / "deploy" / f"{QWEN}.yaml").read_text())
    deploy["stages"][0].setdefault("options", {})["text_wait_s"] = TEXT_WAIT_S
    (base / "deploy.yaml").write_text(yaml.safe_dump(deploy))
    hibari_repository(base / "model_repository")   # the repository `served` builds QWEN into
    with served({QWEN: base / "deploy.yaml"}, base) as server:
        yield server


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
