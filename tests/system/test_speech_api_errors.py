"""Every error the shim answers, each with its status, OpenAI envelope and headers."""
from __future__ import annotations

import contextlib
import time

import httpx
import openai
import pytest

from tests.system.speech_api_helpers import LONG_TEXT

pytest_plugins = ["tests.system.speech_api_fixtures"]
pytestmark = pytest.mark.system

OK = {"model": "tts-1", "input": "Hello.", "voice": "alloy", "response_format": "pcm"}
DATA_URL = "data:audio/wav;base64,UklGRiQAAABXQVZFZm10IBAAAAABAAEAwF0AAIC7AAACABAAZGF0YQAAAAA="


def envelope(response: httpx.Response, status: int, type_: str, param=None, code=None) -> dict:
    assert response.status_code == status, response.text[:500]
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == type_ and error["message"]
    assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


BAD_REQUESTS = [
    ({"input": "x", "voice": "alloy"}, "model"),
    ({"model": "tts-1", "voice": "alloy"}, "input"),
    ({"model": "tts-1", "input": "x"}, "voice"),
    ({**OK, "model": 5}, "model"),
    ({**OK, "input": "   \n"}, "input"),
    ({**OK, "input": "x" * 4097}, "input"),
    ({**OK, "voice": 5}, "voice"),
    ({**OK, "voice": {"name": "heart"}}, "voice"),
    ({**OK, "voice": ""}, "voice"),
    ({**OK, "voice": "nobody"}, "voice"),
    ({**OK, "response_format": "ogg"}, "response_format"),
    ({**OK, "stream_format": "chunks"}, "stream_format"),
    ({**OK, "speed": 0.2}, "speed"),
    ({**OK, "speed": 4.5}, "speed"),
    ({**OK, "speed": "fast"}, "speed"),
    ({**OK, "speed": True}, "speed"),
    ({**OK, "instructions": 5}, "instructions"),
    ({**OK, "instructions": "x" * 4097}, "instructions"),
    ({**OK, "unknown_field": 1}, "unknown_field"),
    ({**OK, "language": "English"}, "language"),
    ({**OK, "task_type": "CustomVoice"}, "task_type"),
    ({**OK, "max_new_tokens": 100}, "max_new_tokens"),
    ({**OK, "initial_codec_chunk_frames": 2}, "initial_codec_chunk_frames"),
    ({**OK, "seed": -1}, "seed"),
    ({**OK, "seed": 1.5}, "seed"),
    ({**OK, "ref_audio": DATA_URL}, "ref_audio"),
    ({**OK, "ref_text": "the words in the reference"}, "ref_text"),
    ({**OK, "ref_audio": "https://example.com/voice.wav"}, "ref_audio"),
]


@pytest.mark.parametrize("body,param", BAD_REQUESTS, ids=[f"{p}-{i}" for i, (_, p) in enumerate(BAD_REQUESTS)])
def test_bad_fields_are_400_naming_the_field(shim, body, param):
    error = envelope(httpx.post(f"{shim.url}/v1/audio/speech", json=body), 400, "invalid_request_error", param)
    assert param in error["message"]


def test_clone_fields_say_the_model_does_not_clone(shim):
    r = httpx.post(f"{shim.url}/v1/audio/speech", json={**OK, "ref_audio": DATA_URL, "ref_text": "hi"})
    assert "does not clone voices" in envelope(r, 400, "invalid_request_error", "ref_audio")["message"]


def test_rejections_from_triton_are_real_400s(shim):
    """The shim cannot see this one: Triton's pipeline finds no words to speak. The status line
    waits for the first audio, so the client still gets a 400, not a broken 200."""
    r = httpx.post(f"{shim.url}/v1/audio/speech", json={**OK, "input": "\U0001F642"})
    error = envelope(r, 400, "invalid_request_error", "input")
    assert "nothing to speak" in error["message"]


@pytest.mark.parametrize("content,headers", [
    (b"not json", {"content-type": "application/json"}),
    (b"[1, 2]", {"content-type": "application/json"}),
    (b"model=tts-1&input=hi&voice=alloy", {"content-type": "application/x-www-form-urlencoded"}),
    (b"\xff\xfe", {"content-type": "application/json"}),
])
def test_malformed_bodies_are_400_never_422(shim, content, headers):
    envelope(httpx.post(f"{shim.url}/v1/audio/speech", content=content, headers=headers), 400,
             "invalid_request_error")


def test_sdk_sees_typed_errors(openai_client):
    with pytest.raises(openai.BadRequestError) as bad:
        openai_client.audio.speech.create(model="tts-1", voice="alloy", input="Hi.", speed=5.0)
    assert bad.value.status_code == 400 and bad.value.param == "speed" and bad.value.type == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as missing:
        openai_client.audio.speech.create(model="no-such-model", voice="alloy", input="Hi.")
    assert missing.value.code == "model_not_found" and missing.value.param == "model"


def test_unknown_model_and_route_are_404(shim):
    envelope(httpx.post(f"{shim.url}/v1/audio/speech", json={**OK, "model": "whisper-1"}), 404,
             "invalid_request_error", "model", "model_not_found")
    envelope(httpx.get(f"{shim.url}/v1/nothing-here"), 404, "invalid_request_error", None, "not_found")
    envelope(httpx.get(f"{shim.url}/v1/audio/speech"), 405, "invalid_request_error")


# ---------------------------------------------------------------- API keys

@pytest.mark.parametrize("authorization", [None, "Bearer wrong", "Basic a2V5LW9uZQ==", "Bearer", "key-one"])
def test_missing_or_wrong_key_is_401(keyed_shim, authorization):
    headers = {"authorization": authorization} if authorization else {}
    r = httpx.post(f"{keyed_shim.url}/v1/audio/speech", json=OK, headers=headers)
    envelope(r, 401, "invalid_request_error", None, "invalid_api_key")
    assert r.headers["www-authenticate"] == "Bearer"
    envelope(httpx.get(f"{keyed_shim.url}/v1/models", headers=headers), 401, "invalid_request_error")


@pytest.mark.parametrize("key", ["key-one", "key-two", "key-three"])
def test_keys_from_env_and_flag_are_accepted(keyed_shim, key):
    r = httpx.post(f"{keyed_shim.url}/v1/audio/speech", json=OK, headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 200 and len(r.content) > 1000


def test_sdk_with_a_wrong_key_gets_authentication_error(keyed_shim):
    client = openai.OpenAI(base_url=f"{keyed_shim.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.audio.speech.create(model="tts-1", voice="alloy", input="Hi.")
    good = openai.OpenAI(base_url=f"{keyed_shim.url}/v1", api_key="key-two", max_retries=0)
    assert len(good.audio.speech.create(model="tts-1", voice="alloy", input="Hi.", response_format="wav").content) > 1000


def test_page_health_and_preflight_need_no_key(keyed_shim):
    assert httpx.get(f"{keyed_shim.url}/").status_code == 200
    assert httpx.get(f"{keyed_shim.url}/health").status_code == 200
    preflight = httpx.options(f"{keyed_shim.url}/v1/audio/speech", headers={
        "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization"})
    assert preflight.status_code == 200


# ---------------------------------------------------------------- overload and outages

@contextlib.contextmanager
def held_stream(url: str, headers: dict | None = None):
    """A long stream that has started (first audio read) and stays open until the block ends."""
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", f"{url}/v1/audio/speech", headers=headers or {},
                           json={**OK, "model": "hibari", "voice": "heart", "input": LONG_TEXT,
                                 "speed": 0.5}) as response:
            assert response.status_code == 200
            chunks = response.iter_raw()  # keep the iterator: dropping it closes the connection
            next(chunks)
            yield


def until_ok(url: str, headers: dict | None = None, timeout_s: float = 10.0) -> httpx.Response:
    deadline = time.monotonic() + timeout_s
    while True:
        r = httpx.post(f"{url}/v1/audio/speech", json=OK, headers=headers or {})
        if r.status_code == 200 or time.monotonic() > deadline:
            return r
        time.sleep(0.1)


def test_shim_stream_limit_is_429_with_retry_after(keyed_shim):
    auth = {"authorization": "Bearer key-one"}
    with held_stream(keyed_shim.url, auth):
        r = httpx.post(f"{keyed_shim.url}/v1/audio/speech", json=OK, headers=auth)
        error = envelope(r, 429, "rate_limit_error", None, "rate_limit_exceeded")
        assert "limit of 1" in error["message"]
        assert r.headers["retry-after"] == "1" and r.headers["retry-after-ms"] == "1000"
        client = openai.OpenAI(base_url=f"{keyed_shim.url}/v1", api_key="key-one", max_retries=0)
        with pytest.raises(openai.RateLimitError):
            client.audio.speech.create(model="tts-1", voice="alloy", input="Hi.")
    assert until_ok(keyed_shim.url, auth).status_code == 200


def test_triton_at_capacity_is_429_with_retry_after(busy_stack):
    _, shim = busy_stack
    with held_stream(shim.url):
        r = httpx.post(f"{shim.url}/v1/audio/speech", json=OK)
        error = envelope(r, 429, "rate_limit_error", None, "rate_limit_exceeded")
        assert "concurrent streams" in error["message"]
        assert int(r.headers["retry-after"]) >= 1
    assert until_ok(shim.url).status_code == 200


def test_no_reachable_triton_is_503(dead_shim):
    r = httpx.post(f"{dead_shim.url}/v1/audio/speech", json=OK)
    envelope(r, 503, "server_error", None, "service_unavailable")
    assert int(r.headers["retry-after"]) >= 1
    health = httpx.get(f"{dead_shim.url}/health")
    assert health.status_code == 503 and health.json()["tritons"][0]["healthy"] is False
    client = openai.OpenAI(base_url=f"{dead_shim.url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.InternalServerError) as e:
        client.audio.speech.create(model="tts-1", voice="alloy", input="Hi.")
    assert e.value.status_code == 503
