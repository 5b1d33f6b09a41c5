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
    if MODEL not in ids:
        pytest.skip(f"{MODEL} is not in the model repository")
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
