"""The two-stage Qwen3-TTS pipeline (tiny random weights) served by a real tritonserver.

Served codes (read straight from the talker stage over gRPC) and served audio (from the entry
model) must equal the in-process engine and decoder on the same checkpoint, also under
concurrency, and a cancelled stream must free its engine slot.
"""
from __future__ import annotations

import functools
import json
import queue
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient

from client.triton_stream import TritonStreamError, synthesize
from tests.metrics_scrape import metric, wait_for
from tests.qwen3_fixtures import talker_stage_responses
from tests.system.concurrent_requests import at_once

pytestmark = pytest.mark.system
PIPELINE = "qwen3_tts_tiny_random"
GREEDY = {"do_sample": False, "subtalker_do_sample": False}
PROMPTS = [
    ("Hello world, this is a streaming test.", {"voice": "ryan", "language": "english", "max_new_tokens": 30}),
    ("A second request with another voice.", {"voice": "Serena", "max_new_tokens": 25}),
    ("今天天气很好，我们去公园散步吧。", {"voice": "eric", "language": "chinese", "max_new_tokens": 20}),
    ("Short.", {"voice": "aiden", "non_streaming_mode": False, "max_new_tokens": 12}),
    ("Repetition penalty off.", {"voice": "vivian", "repetition_penalty": 1.0, "max_new_tokens": 18}),
    ("Chunking overridden per request.", {"voice": "dylan", "initial_chunk_frames": 3, "chunk_frames": 5,
                                          "left_context_frames": 10, "max_new_tokens": 22}),
    ("Sampling with a seed.", {"seed": 1234, "max_new_tokens": 15}),
    ("Another seeded sample.", {"seed": 99, "temperature": 0.7, "top_k": 20, "max_new_tokens": 16}),
]


@pytest.fixture(scope="module")
def reference(triton):
    """The in-process engine, decoder and adapter on the same built-in checkpoint."""
    from omni_backend.models.qwen3_tts.adapter import Qwen3TTSAdapter
    from omni_backend.deploy import default_deploy_path, load_deploy
    from omni_backend.models.qwen3_tts.builtin import resolve_checkpoint
    from omni_backend.models.qwen3_tts.code2wav import Code2Wav

    path = resolve_checkpoint(f"builtin:{PIPELINE}")
    deploy = load_deploy(default_deploy_path(PIPELINE))
    # Same intra-op thread count as the served stages: float reductions depend on it.
    assert deploy.stage(0).threads == deploy.stage(1).threads == 1
    torch.set_num_threads(1)
    from omni_backend.models.qwen3_tts.runner import create_engine
    from omni_backend.models.qwen3_tts.sampling_params import sampling_params_from_request
    import dataclasses

    engine = create_engine(path, max_num_seqs=8)
    defaults = dataclasses.replace(engine.default_params, **deploy.stage(0).default_sampling_params)
    adapter = Qwen3TTSAdapter.from_model(path)
    builder = engine.runner.checkpoint.prompt_builder()
    decoder = Code2Wav.from_checkpoint(f"{path}/speech_tokenizer")
    decoder.batch_invariant = True

    class Reference:
        def codes(self, text, params):
            req = adapter.validate(text, {**GREEDY, **params} if "seed" not in params else params)
            prompt = builder.build(req["text"], speaker=req["voice"], language=req["language"],
                                   instruct=req["instructions"], non_streaming_mode=req["non_streaming_mode"])
            sp = sampling_params_from_request(defaults, req)   # as the talker stage maps its REQUEST
            rid = uuid.uuid4().hex
            return np.asarray(engine.generate([(rid, prompt, sp)])[rid], dtype=np.int64)

        def audio(self, codes, params):
            schedule = deploy.async_chunk.chunk_schedule(params.get("initial_chunk_frames"), params.get("chunk_frames"),
                                                         params.get("left_context_frames"))
            t = torch.from_numpy(codes.T[None].copy())
            return torch.cat(list(decoder.decode_stream(t, schedule)), dim=-1)[0].numpy()

    return Reference()


def _request(params):
    return params if "seed" in params else {**GREEDY, **params}


def served_codes(url: str, text: str, params: dict) -> np.ndarray:
    """Codes straight from the talker stage (its REQUEST is the adapter's normalized request)."""
    from omni_backend.models.qwen3_tts.adapter import Qwen3TTSAdapter
    from omni_backend.models.qwen3_tts.builtin import resolve_checkpoint

    req = Qwen3TTSAdapter.from_model(resolve_checkpoint(f"builtin:{PIPELINE}")).validate(text, _request(params))
    frames = [r["CODES"].reshape(-1, 16) for r in talker_stage_responses(url, PIPELINE, req, ("CODES",))
              if r["CODES"] is not None]
    return np.concatenate(frames).astype(np.int64) if frames else np.zeros((0, 16), dtype=np.int64)


@pytest.mark.parametrize("text,params", PROMPTS[:4], ids=lambda x: str(x)[:20])
def test_served_codes_and_audio_equal_in_process(triton, reference, text, params):
    want_codes = reference.codes(text, params)
    got_codes = served_codes(triton.grpc_url, text, params)
    np.testing.assert_array_equal(got_codes, want_codes)
    res = synthesize(triton.grpc_url, PIPELINE, text, _request(params))
    assert res.sample_rate == 24000
    assert res.audio.size == len(want_codes) * 1920
    np.testing.assert_array_equal(res.audio, reference.audio(want_codes, params))


def test_first_chunk_is_the_initial_chunk(triton):
    """The first chunk is the request's `initial_chunk_frames`; the next grow with the audio sent
    (the deploy's `continuity_rtf`) up to its `chunk_frames`, cut as the deploy's schedule plans."""
    from omni_backend.deploy import default_deploy_path, load_deploy

    res = synthesize(triton.grpc_url, PIPELINE, "Hello there.", {**GREEDY, "max_new_tokens": 40,
                                                                 "initial_chunk_frames": 3, "chunk_frames": 10})
    sizes = [len(c) // 1920 for c in res.chunks]
    schedule = load_deploy(default_deploy_path(PIPELINE)).async_chunk.chunk_schedule(3, 10)
    assert schedule.continuity_rtf > 0
    assert sizes == [w.new_frames for w in schedule.plan(39)] == [3, 4, 6, 7, 3, 10, 6]


def test_concurrent_requests_equal_their_solo_result(triton):
    calls = [functools.partial(synthesize, triton.grpc_url, PIPELINE, t, _request(p)) for t, p in PROMPTS]
    solo = [call().audio for call in calls]
    together = [r.audio for r in at_once(calls)]
    for i in range(len(PROMPTS)):
        np.testing.assert_array_equal(together[i], solo[i], err_msg=f"request {i}")


def test_cancelled_stream_frees_its_slot_and_others_finish_unchanged(triton):
    text, params = PROMPTS[1]
    expected = synthesize(triton.grpc_url, PIPELINE, text, _request(params)).audio
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    results: "queue.Queue" = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    inputs = [grpcclient.InferInput("TEXT", [1], "BYTES"), grpcclient.InferInput("PARAMS", [1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([b"A long request that will be cancelled."], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.array([json.dumps({**GREEDY, "max_new_tokens": 4000}).encode()],
                                           dtype=np.object_))
    client.async_stream_infer(PIPELINE, inputs, enable_empty_final_response=True)
    with ThreadPoolExecutor(1) as pool:
        other = pool.submit(synthesize, triton.grpc_url, PIPELINE, text, _request(params))
        result, error = results.get(timeout=120)
        assert error is None and result.as_numpy("AUDIO").size > 0
        assert metric(triton.metrics_url, "omni_stage_active_requests", model=f"{PIPELINE}__talker") >= 1
        client.stop_stream(cancel_requests=True)
        client.close()
        np.testing.assert_array_equal(other.result(timeout=120).audio, expected)
    assert wait_for(triton.metrics_url, "omni_active_streams", 0, pipeline=PIPELINE) == 0
    assert wait_for(triton.metrics_url, "omni_stage_active_requests", 0, model=f"{PIPELINE}__talker") == 0


@pytest.mark.parametrize("params,field", [
    ({"voice": "nobody"}, "voice"),
    ({"language": "klingon"}, "language"),
    ({"task_type": "VoiceDesign"}, "task_type"),
    ({"temperature": 0, "do_sample": True}, "temperature"),   # 0 alone is greedy
    ({"top_p": 1.5}, "top_p"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"initial_chunk_frames": -1}, "initial_chunk_frames"),
    ({"speed": 1.0}, "speed"),
])
def test_bad_params_are_named(triton, params, field):
    with pytest.raises(TritonStreamError) as e:
        synthesize(triton.grpc_url, PIPELINE, "Hello.", params)
    assert str(e.value).startswith(f"invalid_request: {field}:"), str(e.value)
    assert synthesize(triton.grpc_url, PIPELINE, "Hello.", {**GREEDY, "max_new_tokens": 5}).audio.size == 4 * 1920
