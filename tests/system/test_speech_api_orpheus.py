"""Orpheus through the speech API and the official openai SDK: its voices are listed, every
response format carries the audio Triton streams for the same request (vLLM engine, the
committed `orpheus_tiny_random`), and a bad voice is a 400 naming the field."""
from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest

from client.triton_stream import synthesize
from tests.system.speech_api_helpers import decode

pytest_plugins = ["tests.system.speech_api_fixtures"]
pytestmark = pytest.mark.system
MODEL = "orpheus_tiny_random"
TEXT = "Hello from the Orpheus pipeline."
VOICES = ["tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe"]


@pytest.fixture(scope="module")
def reference(triton):
    return synthesize(triton.grpc_url, MODEL, TEXT, {"voice": "leo", "seed": 7})


def test_voices_are_listed(shim):
    body = httpx.get(f"{shim.url}/v1/audio/voices", params={"model": MODEL}, timeout=30).json()
    assert body["model"] == MODEL and body["voices"] == VOICES and body["default"] == "tara"
    assert body["models"][MODEL] == VOICES


@pytest.mark.parametrize("fmt", ["wav", "pcm", "flac", "mp3", "opus", "aac"])
def test_every_format_carries_the_served_audio(openai_client, reference, fmt):
    response = openai_client.audio.speech.create(model=MODEL, voice="leo", input=TEXT, response_format=fmt,
                                                 extra_body={"seed": 7})
    samples, rate = decode(response.content, fmt)
    assert reference.audio.size > 0
    if fmt in ("wav", "pcm", "flac"):
        quantized = np.round(np.clip(reference.audio, -1, 1) * 32767.0) / 32768.0
        assert rate == 24000
        np.testing.assert_allclose(samples, quantized, atol=2.0 / 32768)
    else:
        assert abs(samples.size / rate - reference.audio_s) < 0.15


def test_unknown_voice_is_a_400_naming_voice(openai_client):
    with pytest.raises(openai.BadRequestError) as e:
        openai_client.audio.speech.create(model=MODEL, voice="alloy-not-here", input=TEXT)
    assert "voice" in str(e.value)


def test_vllm_omni_benchmark_body_is_served(shim):
    """What vLLM-Omni's benchmark posts to any model (no voice, streamed pcm, `ignore_eos`) is
    served (it was a 400: `ignore_eos` unsupported) and `ignore_eos` is listed as a parameter; the
    greedy audio is the default voice's, the same as the request without `ignore_eos` (this
    checkpoint never says eos before its limit)."""
    info = httpx.get(f"{shim.url}/v1/models/{MODEL}", timeout=30).json()
    assert any(p["name"] == "ignore_eos" and p["type"] == "bool" for p in info["parameters"])
    body = {"model": MODEL, "input": TEXT, "stream": True, "stream_format": "audio", "response_format": "pcm",
            "temperature": 0, "max_new_tokens": 70}
    forced = httpx.post(f"{shim.url}/v1/audio/speech", json={**body, "ignore_eos": True}, timeout=120)
    plain = httpx.post(f"{shim.url}/v1/audio/speech", json={**body, "voice": "tara"}, timeout=120)
    assert forced.status_code == plain.status_code == 200, forced.text[:300]
    assert len(forced.content) > 0 and forced.content == plain.content
