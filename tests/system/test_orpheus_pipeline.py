"""Orpheus (Llama LM -> SNAC 24 kHz) served by a real tritonserver, on vLLM and on the torch engine.

One server hosts two builds of the family: `orpheus` on the `tiny` random checkpoint with
`engine: vllm` (a real vLLM worker), and `orpheus_tiny_random` built on the `tiny2` checkpoint with
`engine: torch`. Served greedy audio must equal the reference (orpheus-speech + transformers +
snac) within 1e-4, concurrent requests must equal their solo runs, a cancelled stream must leave
vLLM with nothing running, and bad parameters must be refused with `invalid_request`.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from client.triton_stream import TritonStreamError, stream, synthesize
from tests.metrics_scrape import metric
from tests.requirement import require
from tests.served_pipeline import running
from tests.system.test_reliability import model_ready, ready, wait_until

pytestmark = pytest.mark.system
ROOT = Path(__file__).resolve().parents[2]
VLLM, TORCH = "orpheus", "orpheus_tiny_random"
VLLM_DEPLOY = """pipeline: orpheus
stages:
  - stage_id: 0
    engine: vllm
    device: cpu
    dtype: float32
    max_num_seqs: 8
    max_model_len: 1024
    enforce_eager: true
    options:
      voices: "tara, leah, leo, zac, zoe, Pierre"   # a finetune's voices, one of its own
  - stage_id: 1
    device: cpu
    threads: 1
    max_batch_size: 8
"""


def _vllm_or_skip() -> None:
    venv = ROOT / ".venv-vllm" / "bin" / "python"
    require(venv.exists(), f"vLLM venv missing: {venv} (run `make vllm`)")


@pytest.fixture(scope="module")
def orpheus_server(orpheus_checkpoints, tmp_path_factory):
    _vllm_or_skip()
    work = tmp_path_factory.mktemp("orpheus-served")
    repo = work / "repository"
    (work / "vllm.yaml").write_text(VLLM_DEPLOY)
    builds = [(VLLM, orpheus_checkpoints["tiny"], work / "vllm.yaml"),
              (TORCH, orpheus_checkpoints["tiny2"], ROOT / "deploy" / "orpheus_tiny_random.torch.yaml")]
    for pipeline, model, deploy in builds:
        subprocess.run([sys.executable, "-m", "ensemble_builder", "build", "--pipeline", pipeline, "--model", str(model),
                        "--deploy", str(deploy), "--out", str(repo)], check=True, cwd=ROOT, capture_output=True)
    with running(repo, work / "tritonserver.log") as server:
        yield server


def _greedy(job) -> dict:
    return {"voice": job["voice"], "do_sample": False, "max_new_tokens": job["max_new_tokens"],
            "repetition_penalty": job["repetition_penalty"], **({"seed": job["seed"]} if job["seed"] else {})}


@pytest.mark.parametrize("pipeline,shape", [(VLLM, "tiny"), (TORCH, "tiny2")])
def test_served_greedy_audio_equals_reference(orpheus_server, orpheus_jobs, orpheus_reference, pipeline, shape):
    # both builds list voices (the vLLM one a finetune's own); the voiceless job is the unit tests'
    for job in [j for j in orpheus_jobs if j["shape"] == shape and j["voice"]]:
        result = synthesize(orpheus_server.grpc_url, pipeline, job["text"], _greedy(job))
        want = orpheus_reference[job["name"]]["audio"]
        assert result.sample_rate == 24000
        assert result.audio.shape == want.shape, job["name"]
        assert np.max(np.abs(result.audio - want)) <= 1e-4, job["name"]
        assert all(len(c) % 2048 == 0 for c in result.chunks)


def test_vllm_concurrent_requests_equal_solo(orpheus_server):
    texts = ["Concurrent request number %d, with its own words." % i for i in range(8)]
    params = [{"voice": "leah", "do_sample": False, "max_new_tokens": 56} if i % 2 == 0 else
              {"voice": "zac", "seed": 1000 + i, "temperature": 0.8, "max_new_tokens": 56} for i in range(8)]
    solo = [synthesize(orpheus_server.grpc_url, VLLM, t, p).audio for t, p in zip(texts, params)]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda tp: synthesize(orpheus_server.grpc_url, VLLM, *tp).audio, zip(texts, params)))
    for i, (a, b) in enumerate(zip(solo, together)):
        assert a.size > 0
        np.testing.assert_array_equal(a, b, err_msg=f"request {i}")


def _running(server) -> float:
    return metric(server.metrics_url, "omni_vllm_running_requests", model=f"{VLLM}__lm")


def test_cancelled_stream_is_aborted_in_vllm(orpheus_server):
    """A client that leaves after the first chunk: vLLM's own running count drops to 0 at once,
    and the freed slot serves the next request."""
    chunks = stream(orpheus_server.grpc_url, VLLM, "A long utterance that the client abandons early.",
                    {"max_new_tokens": 700, "do_sample": False})
    next(chunks)
    assert _running(orpheus_server) >= 1
    chunks.close()
    deadline = time.monotonic() + 5
    while _running(orpheus_server) != 0:
        assert time.monotonic() < deadline, "vLLM still runs the cancelled request"
        time.sleep(0.05)
    assert synthesize(orpheus_server.grpc_url, VLLM, "After the cancel.", {"max_new_tokens": 35}).chunks


@pytest.mark.parametrize("params,field", [
    ({"voice": "nobody"}, "voice"),
    ({"temperature": -1}, "temperature"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"top_p": 2}, "top_p"),
    ({"repetition_penalty": "high"}, "repetition_penalty"),
    ({"speed": 2}, "speed"),
])
def test_bad_params_are_invalid_request(orpheus_server, params, field):
    with pytest.raises(TritonStreamError) as e:
        synthesize(orpheus_server.grpc_url, VLLM, "Bad input.", params)
    assert str(e.value).startswith(f"invalid_request: {field}:"), str(e.value)


def test_a_killed_vllm_worker_ends_streams_and_the_stage_recovers(orpheus_server):
    """Runs last in this module (it reloads the pipeline): kill -9 of the vLLM worker mid-stream.
    Open streams end with `unavailable:` within 5 s, readiness turns false within 5 s, the
    supervisor reloads the stage (a fresh worker) and the pipeline serves again."""
    from omni_backend.stubs import server_stubs as stubs

    lm = [s for s in stubs.stubs_of(orpheus_server.server_pid) if s.model == f"{VLLM}__lm"]
    assert len(lm) == 1
    children = Path(f"/proc/{lm[0].pid}/task/{lm[0].pid}/children").read_text().split()
    workers = [int(p) for p in children if b"vllm_worker.py" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(workers) == 1, "the LM stage runs one vLLM worker"
    ends: list[tuple[str, float]] = []

    def client(i: int) -> None:
        try:
            for _ in stream(orpheus_server.grpc_url, VLLM, f"Stream {i} talks for a long time.",
                            {"max_new_tokens": 2000, "do_sample": False}):
                pass
            ends.append(("final", time.monotonic()))
        except TritonStreamError as e:
            ends.append((str(e), time.monotonic()))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(3)]
    for t in threads:
        t.start()
    wait_until(lambda: _running(orpheus_server) == 3, 30)
    killed = time.monotonic()
    os.kill(workers[0], 9)
    for t in threads:
        t.join(30)
    assert len(ends) == 3
    for message, at in ends:
        assert message.startswith("unavailable:"), message
        assert at - killed < 5.0, f"a stream ended {at - killed:.1f} s after the kill"
    unready = wait_until(lambda: ready(orpheus_server) != 200, 5)
    healed = wait_until(lambda: ready(orpheus_server) == 200 and model_ready(orpheus_server, VLLM), 180)
    print(f"streams ended {max(at for _, at in ends) - killed:.2f} s after the kill; not ready after "
          f"{unready:.2f} s; ready again {healed:.1f} s later")
    result = synthesize(orpheus_server.grpc_url, VLLM, "Back again.", {"max_new_tokens": 35, "do_sample": False})
    assert result.chunks
    assert metric(orpheus_server.metrics_url, "omni_stage_active_requests", model=f"{VLLM}__lm") == 0
