"""The embedded English voice served by a real tritonserver, through real gRPC clients."""
from __future__ import annotations

import json
import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from client.triton_stream import TritonStreamError, stream, synthesize
from tests.asr import transcribe, word_error_rate
from tests.metrics_scrape import metric, wait_for
from tests.system.concurrent_requests import at_once

pytestmark = pytest.mark.system

TWO_SENTENCES = "The weather is lovely today. Let us take a walk in the park."


@pytest.fixture(scope="module")
def reference_voice():
    from hibari import Hibari

    return Hibari()


def test_multi_sentence_streams_chunks_that_join_to_the_one_shot_audio(triton, reference_voice):
    text = "First sentence here. Then a second one follows! And finally, a third?"
    res = synthesize(triton.grpc_url, "hibari", text, {"seed": 7})
    assert len(res.chunks) == 3
    assert res.sample_rate == 24000
    one_shot = reference_voice(text, seed=7)
    np.testing.assert_array_equal(res.audio, one_shot)


def test_default_params_match_the_documented_defaults(triton, reference_voice):
    res = synthesize(triton.grpc_url, "hibari", "Defaults are seed zero and normal speed.")
    np.testing.assert_array_equal(res.audio, reference_voice("Defaults are seed zero and normal speed.", seed=0))


def test_speed_changes_duration(triton):
    slow = synthesize(triton.grpc_url, "hibari", TWO_SENTENCES, {"speed": 0.7})
    fast = synthesize(triton.grpc_url, "hibari", TWO_SENTENCES, {"speed": 1.6})
    assert slow.audio_s > 1.5 * fast.audio_s


@pytest.mark.parametrize("sentence", [
    "Hello there, this is a streaming speech test.",
    "The quick brown fox jumps over the lazy dog.",
    "Please call me back tomorrow morning at nine.",
])
def test_intelligible_english(triton, sentence):
    res = synthesize(triton.grpc_url, "hibari", sentence)
    hyp = transcribe(res.audio, res.sample_rate)
    assert word_error_rate(sentence, hyp) <= 0.25, hyp


def test_asr_rejects_noise():
    # The intelligibility check itself must be able to fail.
    noise = np.random.default_rng(0).standard_normal(48000).astype(np.float32) * 0.1
    assert word_error_rate("Hello there, this is a streaming speech test.", transcribe(noise, 24000)) > 0.5


def _raw_request(url: str, text: bytes, params: bytes | None):
    """Send raw bytes (to reach the server with invalid UTF-8 / JSON) and return the error."""
    client = grpcclient.InferenceServerClient(url)
    results: "queue.Queue" = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    inputs = [grpcclient.InferInput("TEXT", [1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([text], dtype=np.object_))
    if params is not None:
        inputs.append(grpcclient.InferInput("PARAMS", [1], "BYTES"))
        inputs[1].set_data_from_numpy(np.array([params], dtype=np.object_))
    client.async_stream_infer("hibari", inputs, enable_empty_final_response=True)
    try:
        while True:
            result, error = results.get(timeout=60)
            if error is not None:
                return error.message()
            if result.get_response().parameters["triton_final_response"].bool_param:
                return None
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("text,params,field", [
    (b"", None, "text"),
    (b"   \n\t ", None, "text"),
    (b"a" * 4097, None, "text"),
    (b"caf\xc3 ok", None, "text"),
    (b"Hello.", b"{not json", "params"),
    (b"Hello.", b"[1, 2]", "params"),
    (b"Hello.", json.dumps({"volume": 3}).encode(), "volume"),
    (b"Hello.", json.dumps({"speed": 2.5}).encode(), "speed"),
    (b"Hello.", json.dumps({"speed": "fast"}).encode(), "speed"),
    (b"Hello.", json.dumps({"seed": -1}).encode(), "seed"),
    (b"Hello.", json.dumps({"voice": "emma"}).encode(), "voice"),
])
def test_bad_input_gets_a_named_error_and_the_server_keeps_serving(triton, text, params, field):
    message = _raw_request(triton.grpc_url, text, params)
    assert message is not None and message.startswith(f"invalid_request: {field}:"), message
    res = synthesize(triton.grpc_url, "hibari", "Still here.")
    assert res.audio_s > 0.3


def test_text_over_the_limit_is_rejected_through_the_client(triton):
    with pytest.raises(TritonStreamError) as e:
        synthesize(triton.grpc_url, "hibari", "x" * 4097)
    assert e.value.code == "invalid_request"


@pytest.mark.parametrize("text", [
    "123 " * 1024,            # no punctuation: one 17-minute chunk needing 17 GB before
    "hello-" * 682,           # cubic G2P: 9 minutes before the first audio
    "1234567890" * 409,       # past the wheel's number words: IndexError, a 500
], ids=["numbers", "hyphen-run", "huge-number"])
def test_any_input_under_the_limit_streams_in_bounded_chunks(triton, text):
    """The first chunks of 20 minutes of speech come at once and are bounded; leaving then
    frees the stream (the rest is never synthesised)."""
    started = time.monotonic()
    chunks = stream(triton.grpc_url, "hibari", text[:4096])
    first = [next(chunks) for _ in range(4)]
    ttfa_s = time.monotonic() - started
    chunks.close()
    assert ttfa_s < 20, ttfa_s
    # a chunk is at most 400 phonemes: under a minute of audio even at the slowest speed
    assert all(0 < audio.size / rate < 60 for audio, rate in first)
    assert wait_for(triton.metrics_url, "omni_active_streams", 0, pipeline="hibari") == 0


def test_concurrent_streams_equal_their_solo_output(triton):
    texts = [f"Stream number {i} says hello. It has {i + 2} apples." for i in range(8)]
    solo = [synthesize(triton.grpc_url, "hibari", t, {"seed": i}).audio for i, t in enumerate(texts)]
    together = at_once([lambda i=i: synthesize(triton.grpc_url, "hibari", texts[i], {"seed": i}).audio
                        for i in range(8)])
    for i in range(8):
        np.testing.assert_array_equal(together[i], solo[i])


def test_cancelled_stream_frees_everything(triton):
    long_text = " ".join(f"This is sentence number {i} of a long story." for i in range(40))
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    results: "queue.Queue" = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    inputs = [grpcclient.InferInput("TEXT", [1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([long_text.encode()], dtype=np.object_))
    client.async_stream_infer("hibari", inputs, enable_empty_final_response=True)
    result, error = results.get(timeout=60)
    assert error is None and result.as_numpy("AUDIO").size > 0
    assert metric(triton.metrics_url, "omni_active_streams", pipeline="hibari") == 1
    client.stop_stream(cancel_requests=True)
    client.close()
    assert wait_for(triton.metrics_url, "omni_active_streams", 0, pipeline="hibari") == 0
    assert wait_for(triton.metrics_url, "omni_stage_active_requests", 0, model="hibari__synthesizer") == 0
    assert metric(triton.metrics_url, "omni_requests_total", pipeline="hibari", outcome="cancelled") >= 1
    assert synthesize(triton.grpc_url, "hibari", "Still serving.").audio_s > 0.3


def test_metrics_count_audio_and_ttfa(triton):
    before = metric(triton.metrics_url, "omni_audio_seconds_total", pipeline="hibari")
    n_before = metric(triton.metrics_url, "omni_ttfa_ms_count", pipeline="hibari")
    res = synthesize(triton.grpc_url, "hibari", TWO_SENTENCES)
    after = metric(triton.metrics_url, "omni_audio_seconds_total", pipeline="hibari")
    assert after - before == pytest.approx(res.audio_s, rel=1e-3)
    assert metric(triton.metrics_url, "omni_ttfa_ms_count", pipeline="hibari") == n_before + 1


def test_every_ending_releases_per_request_state(triton):
    """Finish, an error inside the stage, and an error in the entry all leave nothing behind."""
    url = triton.metrics_url
    synthesize(triton.grpc_url, "hibari", "A normal request.")
    with pytest.raises(TritonStreamError) as e:  # the stage finds nothing to speak
        synthesize(triton.grpc_url, "hibari", "\U0001f642")
    assert str(e.value).startswith("invalid_request: text:")
    with pytest.raises(TritonStreamError):  # rejected by the entry's adapter
        synthesize(triton.grpc_url, "hibari", "Hi.", {"speed": 0})
    assert wait_for(url, "omni_active_streams", 0, pipeline="hibari") == 0
    assert wait_for(url, "omni_stage_active_requests", 0, model="hibari__synthesizer") == 0
    assert synthesize(triton.grpc_url, "hibari", "Still fine.").audio_s > 0.3
