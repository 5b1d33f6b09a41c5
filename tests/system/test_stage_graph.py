"""A family the shared layers have never heard of (tests/toy_family: three stages passing
tensors, declared entirely under tests/) served by a real tritonserver, and the check that the
shared layers name no model family."""
from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from client.triton_process import TritonProcess
from client.triton_stream import TritonStreamError, stream, synthesize
from tests.metrics_scrape import metric
from tests.toy_family import expected_audio

pytestmark = pytest.mark.system
ROOT = Path(__file__).resolve().parents[2]
PIPELINE = "toy_three_stage"
SHARED = ("omni_backend/triton", "omni_backend/engine", "ensemble_builder", "omni_backend/families.py",
          "omni_backend/pipeline.py")


def test_shared_layers_name_no_model_family():
    """Family names and ids live in the family's folder only."""
    from omni_backend.families import pipelines

    names = {p.family for p in pipelines().values()} | set(pipelines())
    names |= {"qwen", "talker", "code2wav", "subtalker", "hibari", "orpheus", "snac", "kokoro"}
    pattern = re.compile("|".join(sorted(map(re.escape, names), key=len, reverse=True)), re.IGNORECASE)
    found = []
    for folder in SHARED:
        paths = [ROOT / folder] if folder.endswith(".py") else sorted((ROOT / folder).rglob("*.py"))
        for path in paths:
            for no, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    if not (path.name == "families.py" and "omni_backend.models." in line):   # the registry lines
                        found.append(f"{path.relative_to(ROOT)}:{no}: {line.strip()}")
    assert not found, "\n".join(found)


@pytest.fixture(scope="module")
def toy_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("toy_repo")
    subprocess.run([sys.executable, "-m", "ensemble_builder", "build", "--family", "tests.toy_family.family",
                    "--pipeline", PIPELINE, "--deploy", str(ROOT / "tests/toy_family/toy_three_stage.yaml"),
                    "--out", str(repo)], check=True, cwd=ROOT, capture_output=True)
    server = TritonProcess(repo, log_path=repo / "tritonserver.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_three_stages_pass_tensors(toy_server):
    text = "Tensors flow: writer -> shaper -> render. Ünïcode ok."
    res = synthesize(toy_server.grpc_url, PIPELINE, text, {"gain": 0.5})
    assert res.sample_rate == 8000
    assert len(res.chunks) == -(-len(text) // 3)         # one render call per writer piece
    np.testing.assert_array_equal(np.concatenate(res.chunks), expected_audio(text, 0.5))


def test_concurrent_requests_equal_their_solo_output(toy_server):
    texts = [f"request number {i} says {'hi ' * i}" for i in range(8)]
    barrier = threading.Barrier(8)

    def run(i):
        barrier.wait()
        return np.concatenate(synthesize(toy_server.grpc_url, PIPELINE, texts[i], {"gain": 1.0 + i / 4}).chunks)

    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(run, range(8)))
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out, expected_audio(texts[i], 1.0 + i / 4))


def test_bad_input_names_its_field_and_a_left_stream_frees_every_stage(toy_server):
    with pytest.raises(TritonStreamError, match=r"^invalid_request: gain:"):
        synthesize(toy_server.grpc_url, PIPELINE, "x", {"gain": 9})
    with pytest.raises(TritonStreamError, match=r"^invalid_request: voice:"):
        synthesize(toy_server.grpc_url, PIPELINE, "x", {"voice": "loud"})
    for _ in stream(toy_server.grpc_url, PIPELINE, "a long text " * 40, {}):
        break   # hang up after the first chunk
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        active = [metric(toy_server.metrics_url, "omni_stage_active_requests", model=f"{PIPELINE}__{s}")
                  for s in ("writer", "shaper")]
        if metric(toy_server.metrics_url, "omni_active_streams", pipeline=PIPELINE) == 0 and active == [0, 0]:
            break
        time.sleep(0.2)
    assert metric(toy_server.metrics_url, "omni_active_streams", pipeline=PIPELINE) == 0
    assert active == [0, 0]
    res = synthesize(toy_server.grpc_url, PIPELINE, "still fine", {})
    np.testing.assert_array_equal(np.concatenate(res.chunks), expected_audio("still fine", 1.0))
