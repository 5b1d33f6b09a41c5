"""Qwen3-Omni's throughput mode served through a real tritonserver.

One server holds the pipeline twice on the same random checkpoint (shape "tiny" of
tests/qwen3_omni_fixtures.py): `qwen3_omni` with `batch_mode: exact` and `qwen3_omni_tiny_random`
with `batch_mode: throughput` in both AR stages. Every test turn, served greedy in throughput mode
all at once (rows sharing each decode forward), gives the text and the audio of the same turn
served alone in exact mode (on these turns the logits stay far from a tie:
tests/unit/test_qwen3_omni_throughput.py measures the distance), and a request that fails among
them leaves the others' answers unchanged.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import yaml

from client.triton_stream import TritonStreamError, stream_parts
from tests.oracle.qwen3_omni_reference import job_messages
from tests.qwen3_omni_fixtures import QWEN3_OMNI_JOBS
from tests.served_pipeline import served

ROOT = Path(__file__).resolve().parents[2]
EXACT = "qwen3_omni"
THROUGHPUT = "qwen3_omni_tiny_random"


def _deploy(pipeline: str, model: str, mode: str, base: Path) -> Path:
    deploy = yaml.safe_load((ROOT / "deploy" / "qwen3_omni_tiny_random.yaml").read_text())
    deploy["pipeline"], deploy["model"] = pipeline, model
    for stage in deploy["stages"][:2]:
        stage["options"]["batch_mode"] = mode
    path = base / f"{pipeline}.yaml"
    path.write_text(yaml.safe_dump(deploy))
    return path


@pytest.fixture(scope="module")
def server(qwen3_omni_checkpoints, tmp_path_factory):
    base = tmp_path_factory.mktemp("omni_throughput")
    checkpoint = str(qwen3_omni_checkpoints["tiny"])
    deploys = {EXACT: _deploy(EXACT, checkpoint, "exact", base),
               THROUGHPUT: _deploy(THROUGHPUT, checkpoint, "throughput", base)}
    with served(deploys, base) as triton:
        yield triton


def _request(job: dict) -> tuple[str, dict]:
    messages = job_messages(job)
    last = messages[-1]["content"]
    text = last if isinstance(last, str) else "".join(part["text"] for part in last)
    params = {"do_sample": False, "talker_do_sample": False, "speaker": job["speaker"],
              "max_tokens": int(job.get("thinker_max_new_tokens", 40)),
              "talker_max_new_tokens": int(job.get("talker_max_new_tokens", 40)), "talker_repetition_penalty": 1.05}
    if messages[:-1]:
        params["messages"] = messages[:-1]
    return text, params


def _answer(server, model: str, text: str, params: dict) -> tuple[str, np.ndarray]:
    deltas, chunks = [], []
    for part in stream_parts(server.grpc_url, model, text, params, timeout_s=300):
        if part.audio is not None and part.audio.size:
            chunks.append(part.audio)
        delta = part.outputs.get("TEXT_DELTA")
        if delta is not None:
            deltas.append(delta.reshape(-1)[0].decode())
    return "".join(deltas), (np.concatenate(chunks) if chunks else np.zeros(0, np.float32))


JOBS = [job for job in QWEN3_OMNI_JOBS if job.get("return_audio", True)]


@pytest.fixture(scope="module")
def solo(server):
    return {job["id"]: _answer(server, EXACT, *_request(job)) for job in JOBS}


def test_throughput_mode_answers_equal_exact_solo_answers(server, solo):
    with ThreadPoolExecutor(len(JOBS)) as pool:
        futures = {job["id"]: pool.submit(_answer, server, THROUGHPUT, *_request(job)) for job in JOBS}
        together = {rid: f.result() for rid, f in futures.items()}
    for rid, (text, audio) in together.items():
        assert solo[rid][1].size >= 1920 * 5, rid   # speech came
        assert text == solo[rid][0], rid
        np.testing.assert_array_equal(audio, solo[rid][1], err_msg=rid)


def test_rows_that_leave_or_fail_leave_the_batch_alone(server, solo):
    """Among batched turns, one client leaves at its first audio (its slots free while the others
    step on: later rows then run beside a padding row) and one conversation overflows the
    thinker's cache (refused, its field named); the others' answers stay those of exact solo runs."""
    jobs = JOBS[:4]
    left = []

    def leave() -> None:
        for part in stream_parts(server.grpc_url, THROUGHPUT, "Tell me everything about whales.",
                                 {"do_sample": False, "talker_do_sample": False}):
            if part.audio is not None and part.audio.size:
                left.append(True)
                return   # closes the gRPC stream: the server cancels the request

    too_long = {"do_sample": False, "messages": [{"role": "user", "content": "word " * 5000}]}
    with ThreadPoolExecutor(len(jobs) + 2) as pool:
        leaving = pool.submit(leave)   # first: it takes slot 0, below the others
        futures = {job["id"]: pool.submit(_answer, server, THROUGHPUT, *_request(job)) for job in jobs}
        failing = pool.submit(_answer, server, THROUGHPUT, "And then?", too_long)
        with pytest.raises(TritonStreamError, match="invalid_request: messages: the prompt takes"):
            failing.result()
        leaving.result()
        for rid, future in futures.items():
            text, audio = future.result()
            assert text == solo[rid][0], rid
            np.testing.assert_array_equal(audio, solo[rid][1], err_msg=rid)
    assert left
