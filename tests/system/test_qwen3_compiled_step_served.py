"""The tiny random Qwen3-TTS served with the talker's frame step compiled (talker option
`compile: default`, inductor), by a real tritonserver: the served audio of greedy requests equals
the in-process pipeline's with the uncompiled static step (same codes, same code2wav windows).

One slot (`max_num_seqs: 1`: one batch bucket) and short prompts (one attention length), so the
server compiles one variant on the first request (about 1.5 min with a cold inductor cache on a
busy 2-core CPU).
"""
from __future__ import annotations

import contextlib
import dataclasses
import uuid

import numpy as np
import pytest
import torch
import yaml

from client.triton_stream import synthesize
from tests.served_pipeline import served

pytestmark = pytest.mark.system
PIPELINE = "qwen3_tts_tiny_random"
GREEDY = {"do_sample": False, "subtalker_do_sample": False}
PROMPTS = [
    ("Hello world, this is a streaming test.", {"voice": "ryan", "language": "english", "max_new_tokens": 20}),
    ("今天天气很好。", {"voice": "eric", "language": "chinese", "max_new_tokens": 14}),
]


@pytest.fixture(scope="module")
def deploy_path(tmp_path_factory):
    from omni_backend.deploy import DEPLOY_DIR

    raw = yaml.safe_load((DEPLOY_DIR / f"{PIPELINE}.yaml").read_text())
    stage = raw["stages"][0]
    stage["max_num_seqs"] = 1
    stage["options"] = {"compile": "default"}
    path = tmp_path_factory.mktemp("compiled_deploy") / f"{PIPELINE}.compiled.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def compiled_server(tmp_path_factory, fresh_builtin_checkpoints, deploy_path):
    with contextlib.ExitStack() as stack:
        with pytest.MonkeyPatch.context() as env:   # set for the server's start only, not this process
            env.setenv("TORCH_LOGS", "dynamo")   # dynamo logs each trace it starts: shows the step was compiled
            server = stack.enter_context(served({PIPELINE: deploy_path}, tmp_path_factory.mktemp("compiled")))
        yield server


def _reference(deploy_path, text: str, params: dict) -> np.ndarray:
    """In-process: the uncompiled static step's greedy codes, decoded as the deploy's schedule cuts them."""
    from omni_backend.deploy import load_deploy
    from omni_backend.models.qwen3_tts.adapter import Qwen3TTSAdapter
    from omni_backend.models.qwen3_tts.builtin import resolve_checkpoint
    from omni_backend.models.qwen3_tts.code2wav import Code2Wav
    from omni_backend.models.qwen3_tts.runner import create_engine
    from omni_backend.models.qwen3_tts.sampling_params import sampling_params_from_request

    path = resolve_checkpoint(f"builtin:{PIPELINE}")
    deploy = load_deploy(deploy_path)
    torch.set_num_threads(deploy.stage(0).threads)
    engine = create_engine(path, max_num_seqs=1, max_model_len=deploy.stage(0).max_model_len, static_step=True)
    defaults = dataclasses.replace(engine.default_params, **deploy.stage(0).default_sampling_params)
    req = Qwen3TTSAdapter.from_model(path).validate(text, {**GREEDY, **params})
    prompt = engine.runner.checkpoint.prompt_builder().build(req["text"], speaker=req["voice"],
                                                             language=req["language"])
    rid = uuid.uuid4().hex
    codes = np.asarray(engine.generate([(rid, prompt, sampling_params_from_request(defaults, req))])[rid])
    decoder = Code2Wav.from_checkpoint(f"{path}/speech_tokenizer", batch_invariant=True)
    t = torch.from_numpy(codes.T[None].astype(np.int64).copy())
    return torch.cat(list(decoder.decode_stream(t, deploy.async_chunk.chunk_schedule())), dim=-1)[0].numpy()


def test_served_compiled_step_audio_equals_uncompiled_in_process(compiled_server, deploy_path):
    for text, params in PROMPTS:
        res = synthesize(compiled_server.grpc_url, PIPELINE, text, {**GREEDY, **params})
        want = _reference(deploy_path, text, params)
        assert want.size == (params["max_new_tokens"] - 1) * 1920   # random weights: no eos
        np.testing.assert_array_equal(res.audio, want)
    traces = [line for line in compiled_server.log_text().splitlines() if "start tracing run" in line]
    assert traces and all("static_step.py" in line for line in traces), traces
