"""The two-stage Qwen3-TTS pipeline (tiny random weights: it speaks noise) behind the shim:
its voices are listed, its extensions pass through under their names, speed is a time-stretch
(the model has no speed control), and its own validation comes back as 400s."""
from __future__ import annotations

import httpx
import openai
import pytest

from tests.system.speech_api_helpers import decode, rms

pytest_plugins = ["tests.system.speech_api_fixtures"]
pytestmark = pytest.mark.system

MODEL = "qwen3_tts_tiny_random"
FRAMES = 20  # 12.5 frames per second: at most 1.6 s of audio


@pytest.fixture(scope="module")
def voices(shim):
    ids = [m["id"] for m in httpx.get(f"{shim.url}/v1/models").json()["data"]]
    assert MODEL in ids, f"{MODEL} is not in the committed model repository: rebuild it (make repository)"
    body = httpx.get(f"{shim.url}/v1/audio/voices", params={"model": MODEL}).json()
    return body["voices"]


def speak(client, speed: float, **extra) -> tuple:
    response = client.audio.speech.create(
        model=MODEL, voice=extra.pop("voice", "alloy"), input="Hello there.", response_format="wav",
        speed=speed, extra_body={"max_new_tokens": FRAMES, "seed": 11, "initial_codec_chunk_frames": 2, **extra})
    return decode(response.content, "wav")


def test_voices_come_from_the_checkpoint(voices):
    assert voices and voices == sorted(voices) and all(v == v.lower() for v in voices)


def test_speech_with_extensions_and_a_time_stretch(openai_client, voices):
    normal, rate = speak(openai_client, 1.0, voice=voices[0], language="english")
    fast, _ = speak(openai_client, 2.0, voice=voices[0], language="english")
    assert rate == 24000 and 0 < normal.size / rate <= FRAMES / 12.5 + 0.05
    assert rms(normal) > 0.001
    assert abs(fast.size / normal.size - 0.5) < 0.01


def test_pipeline_validation_comes_back_as_400(shim, openai_client, voices):
    with pytest.raises(openai.BadRequestError) as e:
        speak(openai_client, 1.0, voice="nobody-here")
    assert e.value.param == "voice"
    with pytest.raises(openai.BadRequestError) as e:  # checked by the adapter inside Triton
        speak(openai_client, 1.0, language="klingon")
    assert e.value.param == "language"
    r = httpx.post(f"{shim.url}/v1/audio/speech", json={
        "model": MODEL, "voice": "alloy", "input": "Hi.", "ref_audio": "data:audio/wav;base64,AAAA"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "ref_audio"


# What `vllm-omni bench serve --omni --backend openai-audio-speech` and its users' clients post:
# no voice, `stream`, `stream_format: audio`, raw pcm, `ignore_eos`.
BENCH_BODY = {"model": MODEL, "input": "Hello there, this is a benchmark request.", "stream": True,
              "stream_format": "audio", "response_format": "pcm", "ignore_eos": True}
DEPLOY_MAX_NEW_TOKENS = 100   # deploy/qwen3_tts_tiny_random.yaml: default_sampling_params
SAMPLES_PER_FRAME = 1920      # 24 kHz / 12.5 frames per second


def test_the_default_voice_is_listed(shim, voices):
    body = httpx.get(f"{shim.url}/v1/models/{MODEL}").json()
    assert body["default_voice"] == "vivian" and body["default_voice"] in body["voices"]
    assert any(p["name"] == "ignore_eos" and p["type"] == "bool" for p in body["parameters"])
    assert httpx.get(f"{shim.url}/v1/audio/voices", params={"model": MODEL}).json()["default"] == "vivian"


def test_vllm_omni_benchmark_request_is_served(shim, voices):
    """That exact body streams pcm; `ignore_eos` runs to `max_new_tokens` (the last token is
    no frame, as the reference), so the audio's length is known exactly."""
    with httpx.stream("POST", f"{shim.url}/v1/audio/speech", json=BENCH_BODY, timeout=120) as r:
        assert r.status_code == 200, r.read()[:500]
        assert r.headers["content-type"].startswith("audio/pcm") or "pcm" in r.headers["content-type"]
        parts = [part for part in r.iter_bytes() if part]
    audio, rate = decode(b"".join(parts), "pcm")
    assert rate == 24000 and len(parts) > 1   # streamed, not one body
    assert audio.size == (DEPLOY_MAX_NEW_TOKENS - 1) * SAMPLES_PER_FRAME
    assert rms(audio) > 0.001


def test_no_voice_speaks_the_default_voice_and_stream_false_is_whole(shim, openai_client, voices):
    """Without `voice` the request speaks as `default_voice` (same seed, same samples); `stream:
    false` answers the same bytes in one body with its length."""
    body = {**BENCH_BODY, "seed": 5, "max_new_tokens": FRAMES}
    default = httpx.post(f"{shim.url}/v1/audio/speech", json=body, timeout=120)
    named = httpx.post(f"{shim.url}/v1/audio/speech", json={**body, "voice": "vivian"}, timeout=120)
    other = httpx.post(f"{shim.url}/v1/audio/speech", json={**body, "voice": "ryan"}, timeout=120)
    whole = httpx.post(f"{shim.url}/v1/audio/speech", json={**body, "stream": False}, timeout=120)
    for r in (default, named, other, whole):
        assert r.status_code == 200, r.text[:500]
    assert len(default.content) == (FRAMES - 1) * SAMPLES_PER_FRAME * 2
    assert default.content == named.content != other.content
    assert whole.content == default.content and int(whole.headers["content-length"]) == len(whole.content)
    # the SDK's own call: `voice: null` is no voice
    sdk = openai_client.audio.speech.with_raw_response.create(
        model=MODEL, voice=None, input=body["input"], response_format="pcm",
        extra_body={"stream": True, "stream_format": "audio", "ignore_eos": True, "seed": 5,
                    "max_new_tokens": FRAMES})
    assert sdk.content == default.content


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_a_request_that_ends_before_its_first_frame_answers_a_whole_body(shim, voices, fmt):
    """`max_new_tokens: 1` yields no frame (as the reference): a complete answer with no audio,
    streamed or whole, labelled with the model's rate (mp3's flush raised and cut the body)."""
    body = {"model": MODEL, "input": "Hello there.", "response_format": fmt, "max_new_tokens": 1}
    for stream in (True, False):
        with httpx.stream("POST", f"{shim.url}/v1/audio/speech", json={**body, "stream": stream}, timeout=60) as r:
            assert r.status_code == 200, r.read()[:300]
            data = r.read()   # raises on a body cut short
            assert r.headers["x-omni-sample-rate"] == "24000"
        if fmt == "wav":
            assert len(data) == 44 and data[:4] == b"RIFF"



@pytest.fixture(scope="module")
def named_shim(triton, tmp_path_factory):
    """A shim that also answers to the hub ids that clients written for vLLM(-Omni) send."""
    from client.speech_api.process import ShimProcess

    shim = ShimProcess([triton.grpc_url], log_path=tmp_path_factory.mktemp("named_shim") / "shim.log",
                       extra_args=["--served-model-name", f"{HUB_ID}={MODEL}",
                                   "--served-model-name", "Qwen/Not-Served=no_such_pipeline"])
    shim.start()
    try:
        yield shim
    finally:
        shim.stop()


HUB_ID = "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice"


def test_a_served_model_name_answers_as_its_pipeline(named_shim, voices):
    """vLLM-Omni's example speech client posts the checkpoint's hub id as `model` (with `voice:
    Vivian`, `task_type`, `language`): with --served-model-name it is the pipeline's request, byte
    for byte; it is listed while its pipeline is served, and a name for a pipeline no server has
    is a 404 like any unknown model."""
    body = {"input": "Hello, how are you?", "voice": "Vivian", "response_format": "wav", "task_type": "CustomVoice",
            "language": "English", "max_new_tokens": FRAMES, "seed": 3}
    named = httpx.post(f"{named_shim.url}/v1/audio/speech", json={"model": HUB_ID, **body}, timeout=120)
    plain = httpx.post(f"{named_shim.url}/v1/audio/speech", json={"model": MODEL, **body}, timeout=120)
    assert named.status_code == 200, named.text[:300]
    assert named.content == plain.content and named.headers["x-omni-model"] == MODEL
    listed = {m["id"]: m["pipeline"] for m in httpx.get(f"{named_shim.url}/v1/models").json()["data"]}
    assert listed[HUB_ID] == MODEL and "Qwen/Not-Served" not in listed
    missing = httpx.post(f"{named_shim.url}/v1/audio/speech", json={"model": "Qwen/Not-Served", **body})
    assert missing.status_code == 404


def test_initial_codec_chunk_frames_zero_starts_with_a_regular_chunk(shim, triton, voices):
    """vLLM-Omni's `initial_codec_chunk_frames: 0` (no initial phase): the first chunk Triton
    streams holds the deploy's `chunk_frames` (25) frames, not its `initial_chunk_frames` (2); the
    speech API takes 0 (it was a 400) and the audio is as long as with the small first chunk."""
    from client.triton_stream import synthesize

    params = {"max_new_tokens": 60, "seed": 3}
    regular = synthesize(triton.grpc_url, MODEL, BENCH_BODY["input"], {**params, "initial_chunk_frames": 0})
    small = synthesize(triton.grpc_url, MODEL, BENCH_BODY["input"], params)
    assert small.chunks[0].size == 2 * SAMPLES_PER_FRAME and regular.chunks[0].size == 25 * SAMPLES_PER_FRAME
    assert regular.audio.size == small.audio.size > 25 * SAMPLES_PER_FRAME
    body = {**BENCH_BODY, "ignore_eos": False, **params, "initial_codec_chunk_frames": 0}
    r = httpx.post(f"{shim.url}/v1/audio/speech", json=body, timeout=120)
    assert r.status_code == 200, r.text[:300]
    assert len(r.content) == regular.audio.size * 2
