"""The tiny random Qwen3-TTS served with code2wav in the talker's process (the talker stage's
option `code2wav: in_talker`, deploy/qwen3_tts_tiny_random.in_talker.yaml), by a real tritonserver;
and the same with the talker in the entry's process too (`process: entry`,
deploy/qwen3_tts_tiny_random.in_entry.yaml): the whole pipeline in one process; and with the talker
there and code2wav placed per request (`code2wav: adaptive`, deploy/qwen3_tts_tiny_random.adaptive.yaml):
a request alone is decoded by the talker, requests in company by code2wav, and the samples are the
same (concurrent = solo mixes both placements).

The served audio must be what the two-process deploy serves: equal to the in-process engine and
decoder with the deploy's chunk schedule, also under concurrency, the chunks cut as that schedule
plans; and the talker's own responses carry audio, never codes.
"""
from __future__ import annotations

import dataclasses
import functools
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from client.triton_stream import synthesize
from tests.metrics_scrape import metric
from tests.qwen3_fixtures import talker_stage_responses
from tests.served_pipeline import served
from tests.system.concurrent_requests import at_once

pytestmark = pytest.mark.system
ROOT = Path(__file__).resolve().parents[2]
PIPELINE = "qwen3_tts_tiny_random"
DEPLOY = ROOT / "deploy" / f"{PIPELINE}.in_talker.yaml"
GREEDY = {"do_sample": False, "subtalker_do_sample": False}
PROMPTS = [
    ("Hello world, this is a streaming test.", {"voice": "ryan", "language": "english", "max_new_tokens": 30}),
    ("A second request with another voice.", {"voice": "Serena", "max_new_tokens": 25}),
    ("Short.", {"voice": "aiden", "non_streaming_mode": False, "max_new_tokens": 12}),
    ("Chunking overridden per request.", {"voice": "dylan", "initial_chunk_frames": 3, "chunk_frames": 5,
                                          "left_context_frames": 10, "max_new_tokens": 22}),
    ("Sampling with a seed.", {"seed": 1234, "max_new_tokens": 15}),
    ("今天天气很好，我们去公园散步吧。", {"voice": "eric", "language": "chinese", "max_new_tokens": 20}),
]


def _request(params: dict) -> dict:
    return params if "seed" in params else {**GREEDY, **params}


@pytest.fixture(scope="module", params=["in_talker", "in_entry", "adaptive"])
def in_talker(request, tmp_path_factory, fresh_builtin_checkpoints):
    deploy = ROOT / "deploy" / f"{PIPELINE}.{request.param}.yaml"
    with served({PIPELINE: deploy}, tmp_path_factory.mktemp(request.param)) as server:
        server.placement = request.param
        yield server


@pytest.fixture(scope="module")
def reference():
    """In-process: the engine's greedy codes, decoded window by window as the deploy's schedule cuts them."""
    from omni_backend.deploy import load_deploy
    from omni_backend.models.qwen3_tts.adapter import Qwen3TTSAdapter
    from omni_backend.models.qwen3_tts.builtin import resolve_checkpoint
    from omni_backend.models.qwen3_tts.code2wav import Code2Wav
    from omni_backend.models.qwen3_tts.runner import create_engine
    from omni_backend.models.qwen3_tts.sampling_params import sampling_params_from_request

    path = resolve_checkpoint(f"builtin:{PIPELINE}")
    deploy = load_deploy(DEPLOY)
    assert deploy.stage(0).threads == deploy.stage(1).threads == 1   # float reductions depend on it
    torch.set_num_threads(1)
    engine = create_engine(path, max_num_seqs=8)
    defaults = dataclasses.replace(engine.default_params, **deploy.stage(0).default_sampling_params)
    adapter = Qwen3TTSAdapter.from_model(path)
    builder = engine.runner.checkpoint.prompt_builder()
    decoder = Code2Wav.from_checkpoint(f"{path}/speech_tokenizer", batch_invariant=True)

    def audio(text: str, params: dict) -> np.ndarray:
        req = adapter.validate(text, _request(params))
        prompt = builder.build(req["text"], speaker=req["voice"], language=req["language"],
                               instruct=req["instructions"], non_streaming_mode=req["non_streaming_mode"])
        rid = uuid.uuid4().hex
        codes = np.asarray(engine.generate([(rid, prompt, sampling_params_from_request(defaults, req))])[rid])
        schedule = deploy.async_chunk.chunk_schedule(params.get("initial_chunk_frames"), params.get("chunk_frames"),
                                                     params.get("left_context_frames"))
        t = torch.from_numpy(codes.T[None].astype(np.int64).copy())
        return torch.cat(list(decoder.decode_stream(t, schedule)), dim=-1)[0].numpy()

    return audio


def talker_responses(url: str, text: str, params: dict) -> list[dict[str, np.ndarray | None]]:
    """The talker stage's own responses over gRPC (its REQUEST is the adapter's normalized request)."""
    from omni_backend.models.qwen3_tts.adapter import Qwen3TTSAdapter
    from omni_backend.models.qwen3_tts.builtin import resolve_checkpoint

    req = Qwen3TTSAdapter.from_model(resolve_checkpoint(f"builtin:{PIPELINE}")).validate(text, _request(params))
    return talker_stage_responses(url, PIPELINE, req)


@pytest.mark.parametrize("text,params", PROMPTS[:5], ids=lambda x: str(x)[:20])
def test_served_audio_equals_in_process(in_talker, reference, text, params):
    res = synthesize(in_talker.grpc_url, PIPELINE, text, _request(params))
    want = reference(text, params)
    assert res.sample_rate == 24000
    np.testing.assert_array_equal(res.audio, want)


def test_chunks_follow_the_schedule(in_talker):
    from omni_backend.deploy import load_deploy

    res = synthesize(in_talker.grpc_url, PIPELINE, "Hello there.", {**GREEDY, "max_new_tokens": 40,
                                                                    "initial_chunk_frames": 3, "chunk_frames": 10})
    sizes = [len(c) // 1920 for c in res.chunks]
    schedule = load_deploy(DEPLOY).async_chunk.chunk_schedule(3, 10)
    assert sizes == [w.new_frames for w in schedule.plan(39)] == [3, 4, 6, 7, 3, 10, 6]


def test_the_talker_streams_audio_not_codes(in_talker):
    """The talker decodes its own windows: each of its responses is a window's audio, the codes never
    leave its process (so the entry calls no code2wav)."""
    from omni_backend.deploy import load_deploy

    if not (in_talker.repo / f"{PIPELINE}__talker").exists():   # in the entry's process: no model to ask
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(in_talker.grpc_url)
        assert client.is_model_ready(PIPELINE) and not client.is_model_ready(f"{PIPELINE}__talker")
        client.close()
        return
    responses = talker_responses(in_talker.grpc_url, "Hello there.", {"max_new_tokens": 12})
    assert [r["CODES"] for r in responses] == [None] * len(responses)
    sizes = [r["AUDIO"].size // 1920 for r in responses]
    schedule = load_deploy(DEPLOY).async_chunk.chunk_schedule()
    assert sizes == [w.new_frames for w in schedule.plan(11)] == [2, 2, 3, 4]   # as the 40-token request above


def _code2wav_calls(server) -> float:
    """Windows code2wav decoded (its liveness pings not counted)."""
    return metric(server.metrics_url, "omni_stage_batched_requests_total", model=f"{PIPELINE}__code2wav")


def test_concurrent_requests_equal_their_solo_result(in_talker):
    """Alone, `in_talker` decodes every window in the talker (code2wav is never called) and
    `adaptive` the first only (code2wav the rest); together, `adaptive` leaves the first windows
    of the requests that found company to code2wav too, with the same samples."""
    from tests.metrics_scrape import wait_for

    calls = _code2wav_calls(in_talker)
    requests = [functools.partial(synthesize, in_talker.grpc_url, PIPELINE, t, _request(p)) for t, p in PROMPTS]
    results = [request() for request in requests]
    solo = [r.audio for r in results]
    handed = sum(len(r.chunks) - 1 for r in results) if in_talker.placement == "adaptive" else 0
    assert wait_for(in_talker.metrics_url, "omni_stage_batched_requests_total", calls + handed,
                    model=f"{PIPELINE}__code2wav") == calls + handed
    calls += handed
    together = [r.audio for r in at_once(requests)]
    for i in range(len(PROMPTS)):
        np.testing.assert_array_equal(together[i], solo[i], err_msg=f"request {i}")
    if in_talker.placement == "adaptive":   # first windows of requests that found company, too
        assert _code2wav_calls(in_talker) > calls + handed
    else:
        assert _code2wav_calls(in_talker) == calls


def test_a_stream_that_gets_company_keeps_its_samples(in_talker):
    """A long request alone, then two more while it runs: with `adaptive` its first window is
    decoded in the talker and the rest by code2wav, batched with the others' windows, and its audio
    is still what it is alone (as are theirs); the other placements never call code2wav."""
    from client.triton_stream import stream

    long_text, long_params = "A long request that is alone at first, then has company.", _request(
        {"voice": "ryan", "max_new_tokens": 60})
    others = PROMPTS[:2]
    alone = synthesize(in_talker.grpc_url, PIPELINE, long_text, long_params).audio
    solo = [synthesize(in_talker.grpc_url, PIPELINE, t, _request(p)).audio for t, p in others]
    calls = _code2wav_calls(in_talker)
    first = threading.Event()
    chunks: list[np.ndarray] = []

    def run_long() -> None:
        for audio, _rate in stream(in_talker.grpc_url, PIPELINE, long_text, long_params):
            chunks.append(audio)
            first.set()

    runner = threading.Thread(target=run_long)
    runner.start()
    assert first.wait(60)
    with ThreadPoolExecutor(len(others)) as pool:
        together = list(pool.map(lambda job: synthesize(in_talker.grpc_url, PIPELINE, job[0], _request(job[1])).audio,
                                 others))
    runner.join(120)
    np.testing.assert_array_equal(np.concatenate(chunks), alone)
    for got, want in zip(together, solo):
        np.testing.assert_array_equal(got, want)
    if in_talker.placement == "adaptive":
        assert _code2wav_calls(in_talker) > calls
    else:
        assert _code2wav_calls(in_talker) == calls
