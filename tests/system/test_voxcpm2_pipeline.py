"""VoxCPM2 (form C: the LM's every step runs a diffusion side module -> AudioVAE) served by a
real tritonserver.

One server hosts two builds: ``voxcpm2_tiny_random`` (the built-in random checkpoint, the writer's
``tiny`` shape) and ``voxcpm2`` on the ``tiny2`` checkpoint, both on CPU; a second server hosts
``voxcpm2`` on the ``tiny3`` checkpoint (one pipeline name holds one checkpoint per server). With
the same seed the served audio of each job (English, Chinese, long, mixed, voice design from a
description, cloning in the
reference's three modes: two by continuation from ``ref_audio`` + ``ref_text``, one from
``ref_audio`` alone as a reference, one in both modes) equals the reference's (voxcpm 2.0.3's non-streaming ``generate``)
within 1e-4 on all three shapes; 8 concurrent requests equal their solo runs (on ``tiny`` and
``tiny3``); bad values are refused with ``invalid_request`` naming the field; a recording is
encoded once.
"""
from __future__ import annotations

import base64
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from client.triton_stream import TritonStreamError, synthesize
from tests.metrics_scrape import metric
from tests.served_pipeline import running
from tests.voxcpm2_fixtures import WAVEFORM_ATOL

pytestmark = pytest.mark.system
ROOT = Path(__file__).resolve().parents[2]
BUILTIN, BUILT = "voxcpm2_tiny_random", "voxcpm2"
DEPLOY = """pipeline: voxcpm2
async_chunk:
  initial_chunk_frames: 1
  chunk_frames: 3
  left_context_frames: 24
stages:
  - stage_id: 0
    device: cpu
    threads: 1
    max_num_seqs: 8
    max_model_len: 4096
  - stage_id: 1
    device: cpu
    threads: 1
    max_batch_size: 8
"""


def _serve(work: Path, builds: list[list[str]]):
    """A tritonserver over a repository of ``builds`` (``ensemble_builder build`` arguments)."""
    repo = work / "repository"
    for args in builds:
        subprocess.run([sys.executable, "-m", "ensemble_builder", "build", *args, "--out", str(repo)], check=True,
                       cwd=ROOT, capture_output=True)
    with running(repo, work / "tritonserver.log") as server:
        yield server


@pytest.fixture(scope="module")
def voxcpm2_server(voxcpm2_checkpoints, tmp_path_factory):
    work = tmp_path_factory.mktemp("voxcpm2-served")
    (work / "voxcpm2.yaml").write_text(DEPLOY)
    yield from _serve(work, [["--pipeline", BUILTIN],
                             ["--pipeline", BUILT, "--model", str(voxcpm2_checkpoints["tiny2"]),
                              "--deploy", str(work / "voxcpm2.yaml")]])


@pytest.fixture(scope="module")
def voxcpm2_tiny3_server(voxcpm2_checkpoints, tmp_path_factory):
    """The third random shape (one backbone layer, three residual layers, its own patch size and
    VAE rates) served as ``voxcpm2`` with the same deploy."""
    work = tmp_path_factory.mktemp("voxcpm2-tiny3-served")
    (work / "voxcpm2.yaml").write_text(DEPLOY)
    yield from _serve(work, [["--pipeline", BUILT, "--model", str(voxcpm2_checkpoints["tiny3"]),
                              "--deploy", str(work / "voxcpm2.yaml")]])


def _params(job: dict) -> dict:
    """PARAMS of a job: a recording with its transcript clones by continuation, one alone as a
    reference (the defaults); both modes at once by naming ``ref_continuation``."""
    params = {k: job[k] for k in ("seed", "cfg_value", "inference_timesteps", "min_len", "max_len") if k in job}
    recording = job.get("prompt_wav") or job.get("reference_wav")
    if recording:
        params["ref_audio"] = "data:audio/wav;base64," + base64.b64encode(Path(recording).read_bytes()).decode()
    if job.get("prompt_wav"):
        params["ref_text"] = job["prompt_text"]
    if job.get("prompt_wav") and job.get("reference_wav"):
        params["clone_mode"] = "ref_continuation"
    if job.get("control"):
        params["instructions"] = job["control"]
    return params


@pytest.mark.parametrize("server,pipeline,shape", [("voxcpm2_server", BUILTIN, "tiny"),
                                                   ("voxcpm2_server", BUILT, "tiny2"),
                                                   ("voxcpm2_tiny3_server", BUILT, "tiny3")])
def test_served_audio_equals_reference(request, voxcpm2_reference, voxcpm2_jobs, server, pipeline, shape):
    url = request.getfixturevalue(server).grpc_url
    for job in voxcpm2_jobs:
        if pipeline == BUILTIN and job.get("prompt_wav") and job.get("reference_wav"):
            # the tiny shape makes a 16-sample patch: the recording twice over is 2,400 positions, more
            # than the built-in deploy's 2,048 (a released checkpoint's patch is 2,560 samples)
            continue
        want = voxcpm2_reference[shape]["jobs"][job["id"]]["waveform"]
        result = synthesize(url, pipeline, job["text"], _params(job))
        assert result.sample_rate == 48000
        assert result.audio.shape == want.shape, job["id"]
        np.testing.assert_allclose(result.audio, want, atol=WAVEFORM_ATOL, rtol=0, err_msg=f"{shape}/{job['id']}")
        assert len(result.chunks) > 1, job["id"]         # streamed in windows, not at the end


@pytest.mark.parametrize("server,pipeline", [("voxcpm2_server", BUILTIN), ("voxcpm2_tiny3_server", BUILT)])
def test_concurrent_requests_equal_solo(request, server, pipeline):
    url = request.getfixturevalue(server).grpc_url
    texts = [f"Concurrent request number {i}, with its own words." for i in range(8)]
    params = [{"seed": 100 + i, "min_len": 4 + i, "inference_timesteps": (4, 6)[i % 2]} for i in range(8)]
    solo = [synthesize(url, pipeline, t, p).audio for t, p in zip(texts, params)]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda tp: synthesize(url, pipeline, *tp).audio, zip(texts, params)))
    for i, (a, b) in enumerate(zip(solo, together)):
        assert a.size > 0
        np.testing.assert_array_equal(a, b, err_msg=f"request {i}")


def test_a_recording_is_encoded_once(voxcpm2_server, voxcpm2_jobs):
    job = next(j for j in voxcpm2_jobs if j.get("prompt_wav"))
    params = {**_params(job), "ref_text": "another transcript."}
    before = metric(voxcpm2_server.metrics_url, "omni_voice_encodings_total", model=f"{BUILTIN}__lm") or 0
    a = synthesize(voxcpm2_server.grpc_url, BUILTIN, "Once.", {**params, "seed": 9}).audio
    b = synthesize(voxcpm2_server.grpc_url, BUILTIN, "Once.", {**params, "seed": 9}).audio
    after = metric(voxcpm2_server.metrics_url, "omni_voice_encodings_total", model=f"{BUILTIN}__lm")
    np.testing.assert_array_equal(a, b)
    assert after - before <= 1      # the other test may have encoded it already


@pytest.mark.parametrize("params,field", [
    ({"cfg_value": -1}, "cfg_value"),
    ({"inference_timesteps": 0}, "inference_timesteps"),
    ({"inference_timesteps": 2.5}, "inference_timesteps"),
    ({"max_len": 0}, "max_len"),
    ({"min_len": 10, "max_len": 5}, "min_len"),
    ({"seed": -3}, "seed"),
    ({"ref_audio": "bm90IGF1ZGlv", "ref_text": "x"}, "ref_audio"),
    ({"ref_text": "a transcript alone"}, "ref_text"),
    ({"clone_mode": "reference"}, "clone_mode"),
    ({"ref_audio": "RECORDING", "clone_mode": "mimic"}, "clone_mode"),
    ({"ref_audio": "RECORDING", "clone_mode": "continuation"}, "ref_text"),
    ({"ref_audio": "RECORDING", "clone_mode": "ref_continuation", "ref_text": "  "}, "ref_text"),
    ({"ref_audio": "RECORDING", "clone_mode": "reference", "ref_text": "words"}, "ref_text"),
    ({"voice": "heart"}, "voice"),
    ({"ref_audio": "RECORDING", "ref_text": "the reference speaks.", "instructions": "calm"}, "instructions"),
    # the recording twice over (2,400 positions) does not fit the built-in deploy's 2,048: the
    # recording is named, not the text
    ({"ref_audio": "RECORDING", "clone_mode": "ref_continuation", "ref_text": "the reference speaks."}, "ref_audio"),
])
def test_bad_params_are_invalid_request(voxcpm2_server, voxcpm2_recording, params, field):
    if params.get("ref_audio") == "RECORDING":
        params = {**params, "ref_audio": base64.b64encode(voxcpm2_recording.read_bytes()).decode()}
    with pytest.raises(TritonStreamError) as e:
        synthesize(voxcpm2_server.grpc_url, BUILTIN, "Bad input.", params)
    assert str(e.value).startswith(f"invalid_request: {field}:"), str(e.value)


@pytest.fixture(scope="module")
def voxcpm2_shim(voxcpm2_server, tmp_path_factory):
    from client.speech_api.process import ShimProcess

    shim = ShimProcess([voxcpm2_server.grpc_url], log_path=tmp_path_factory.mktemp("voxcpm2-shim") / "shim.log")
    shim.start()
    try:
        yield shim
    finally:
        shim.stop()


def test_speech_api_speaks_and_clones(voxcpm2_shim, voxcpm2_server, voxcpm2_jobs):
    """The OpenAI SDK through the speech API: the model's catalog (no preset voices, clones), and a
    cloning request (a stock voice name, ``seed``, ``ref_audio``, ``ref_text``) that equals the same
    request sent to Triton directly; the model's own knobs (``cfg_value``, ``inference_timesteps``)
    pass by name and a bad one is a 400 naming it."""
    import io

    import httpx
    import openai
    import soundfile as sf

    info = httpx.get(f"{voxcpm2_shim.url}/v1/models/{BUILTIN}", timeout=30).json()
    assert info.get("clones_voices") is True and not info.get("voices")
    client = openai.OpenAI(base_url=f"{voxcpm2_shim.url}/v1", api_key="not-needed", max_retries=0, timeout=120)
    job = next(j for j in voxcpm2_jobs if j["id"] == "clone_en")
    params = {k: v for k, v in _params(job).items() if k in ("seed", "ref_audio", "ref_text")}
    params.update(cfg_value=1.5, inference_timesteps=3)
    wav = client.audio.speech.create(model=BUILTIN, voice="alloy", input=job["text"], response_format="wav",
                                     extra_body=params).read()
    audio, rate = sf.read(io.BytesIO(wav), dtype="float32")
    direct = synthesize(voxcpm2_server.grpc_url, BUILTIN, job["text"], params).audio
    assert rate == 48000 and audio.shape == direct.shape
    np.testing.assert_allclose(audio, direct, atol=2 / 32768)   # 16-bit PCM in the wav (its scaling and rounding)
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.speech.create(model=BUILTIN, voice="alloy", input="Bad.", extra_body={"ref_text": "alone"})
    assert "ref_text" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.speech.create(model=BUILTIN, voice="alloy", input="Bad.", extra_body={"cfg_value": -1})
    assert e.value.param == "cfg_value"
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.speech.create(model=BUILTIN, voice="alloy", input="Bad.", extra_body={"cfg_scale": 2})
    assert e.value.param == "cfg_scale" and e.value.code == "unknown_parameter"


def test_a_registered_voice_without_transcript_clones_as_a_reference(voxcpm2_server, voxcpm2_recording, tmp_path):
    """A voice uploaded to the speech API without its transcript speaks through VoxCPM2's
    reference mode: the same audio as ``ref_audio`` alone sent to Triton (it was refused: the
    speech API asked for Qwen3-TTS's ``x_vector_only_mode``)."""
    import io

    import httpx
    import soundfile as sf

    from client.speech_api.process import ShimProcess

    shim = ShimProcess([voxcpm2_server.grpc_url], log_path=tmp_path / "shim.log",
                       extra_args=["--voices-dir", str(tmp_path / "voices")])
    shim.start()
    try:
        wav = voxcpm2_recording.read_bytes()
        r = httpx.post(f"{shim.url}/v1/audio/voices", data={"name": "narrator", "consent": "true"},
                       files={"audio": ("voice.wav", wav, "audio/wav")}, timeout=60)
        assert r.status_code == 201, r.text
        body = {"model": BUILTIN, "voice": "narrator", "input": "Only the voice.", "response_format": "wav",
                "seed": 3, "inference_timesteps": 3}
        r = httpx.post(f"{shim.url}/v1/audio/speech", json=body, timeout=120)
        assert r.status_code == 200, r.text
        served, rate = sf.read(io.BytesIO(r.content), dtype="float32")
        assert rate == 48000
        direct = synthesize(voxcpm2_server.grpc_url, BUILTIN, "Only the voice.",
                            {"ref_audio": base64.b64encode(wav).decode(), "seed": 3, "inference_timesteps": 3})
        assert served.shape == direct.audio.shape and served.size > 0
        np.testing.assert_allclose(served, direct.audio, atol=2 / 32768)
    finally:
        shim.stop()


def test_ignore_eos_runs_to_the_patch_limit_and_an_unknown_voice_is_refused(voxcpm2_shim, voxcpm2_server):
    """vLLM-Omni's benchmark body (no voice, streamed pcm, ``ignore_eos``) with ``max_new_tokens``
    (the patch limit, ``max_len``): the stop head ends nothing, so the audio grows with the limit
    (twice the patches, twice the samples) past where the random stop head ends it, as Triton's
    own PARAMS do. A voice name that is neither registered nor a stock name
    is a 400 naming ``voice`` (it was taken and ignored)."""
    import httpx

    from tests.system.speech_api_helpers import decode

    def speak(**extra) -> np.ndarray:
        body = {"model": BUILTIN, "input": "Hello there, this is a benchmark request.", "stream": True,
                "stream_format": "audio", "response_format": "pcm", "seed": 7, **extra}
        r = httpx.post(f"{voxcpm2_shim.url}/v1/audio/speech", json=body, timeout=120)
        assert r.status_code == 200, r.text[:300]
        return decode(r.content, "pcm")[0]

    stops = speak()
    twelve, twenty_four = speak(ignore_eos=True, max_new_tokens=12), speak(ignore_eos=True, max_new_tokens=24)
    assert 0 < stops.size < twelve.size and twenty_four.size == 2 * twelve.size
    assert direct_size(voxcpm2_server, 12) * twenty_four.size == direct_size(voxcpm2_server, 24) * twelve.size
    r = httpx.post(f"{voxcpm2_shim.url}/v1/audio/speech", timeout=60,
                   json={"model": BUILTIN, "input": "Hi.", "voice": "nonexistent"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "voice", r.text


def direct_size(server, max_len: int) -> int:
    """Samples of a request sent to Triton itself with ``ignore_eos`` and ``max_len``."""
    return synthesize(server.grpc_url, BUILTIN, "Hello there, this is a benchmark request.",
                      {"ignore_eos": True, "max_len": max_len, "seed": 7}).audio.size


def test_instructions_design_the_voice_through_the_speech_api(voxcpm2_shim, voxcpm2_server, voxcpm2_recording):
    """OpenAI's `instructions` reach VoxCPM2 as its voice design (the served audio equals Triton's
    with PARAMS `instructions`, which the parity jobs check against the reference's
    `(description)text`), nothing is reported ignored; with a transcript (continuation) it is a
    400 naming `instructions`, as the package's CLI refuses it."""
    import httpx

    from tests.system.speech_api_helpers import decode

    body = {"model": BUILTIN, "input": "A designed voice speaks.", "response_format": "pcm", "seed": 8,
            "instructions": "A young woman, gentle and sweet voice"}
    r = httpx.post(f"{voxcpm2_shim.url}/v1/audio/speech", json=body, timeout=120)
    assert r.status_code == 200, r.text[:300]
    assert "x-omni-ignored-fields" not in r.headers
    plain = httpx.post(f"{voxcpm2_shim.url}/v1/audio/speech", json={**body, "instructions": None}, timeout=120)
    direct = synthesize(voxcpm2_server.grpc_url, BUILTIN, body["input"], {"seed": 8, "instructions": body["instructions"]})
    served, rate = decode(r.content, "pcm")
    assert rate == 24000 and r.content != plain.content
    # pcm is 24 kHz: the 48 kHz audio halved (the speech API's resampler), so compare lengths
    assert abs(served.size * 2 - direct.audio.size) <= 2 and direct.audio.size > 0
    wav = "data:audio/wav;base64," + base64.b64encode(voxcpm2_recording.read_bytes()).decode()
    r = httpx.post(f"{voxcpm2_shim.url}/v1/audio/speech", timeout=60, json={
        **body, "ref_audio": wav, "ref_text": "the reference speaks."})
    assert r.status_code == 400 and r.json()["error"]["param"] == "instructions", r.text
