"""Every error the shim answers, each with its status, OpenAI envelope and headers."""
from __future__ import annotations

import contextlib
import json
import re
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


def post(shim, body) -> httpx.Response:
    """The body as json.dumps writes it: lone surrogates as \ud800 escapes, NaN as NaN. httpx's
    `json=` refuses both, other clients send them."""
    return httpx.post(f"{shim.url}/v1/audio/speech", content=json.dumps(body).encode(),
                      headers={"content-type": "application/json"}, timeout=60)


QWEN3 = {"model": "qwen3_tts_tiny_random", "input": "Hello.", "voice": "vivian", "response_format": "pcm"}
MISSING, INVALID, TOO_LONG, UNKNOWN, UNSUPPORTED = ("missing_required_parameter", "invalid_value",
                                                    "string_above_max_length", "unknown_parameter",
                                                    "unsupported_parameter")
# (body, param, code): every one a 400 invalid_request_error.
BAD_REQUESTS = [
    ({"input": "x", "voice": "alloy", "model": "  "}, "model", INVALID),   # none at all: the default model
    ({"model": "tts-1", "voice": "alloy"}, "input", MISSING),
    ({**OK, "model": 5}, "model", INVALID),
    ({**OK, "input": "   \n"}, "input", INVALID),
    ({**OK, "input": "x" * 4097}, "input", TOO_LONG),
    ({**OK, "input": ["Hello."]}, "input", INVALID),
    ({**OK, "voice": 5}, "voice", INVALID),
    ({**OK, "voice": {"name": "heart"}}, "voice", INVALID),
    ({**OK, "voice": {"id": {"id": "heart"}}}, "voice", INVALID),
    ({**OK, "voice": ""}, "voice", INVALID),
    ({**OK, "voice": "nobody"}, "voice", INVALID),
    ({**OK, "response_format": "ogg"}, "response_format", INVALID),
    ({**OK, "stream_format": "chunks"}, "stream_format", INVALID),
    ({**OK, "speed": 0.2}, "speed", INVALID),
    ({**OK, "speed": 4.5}, "speed", INVALID),
    ({**OK, "speed": "fast"}, "speed", INVALID),
    ({**OK, "speed": True}, "speed", INVALID),
    ({**OK, "instructions": 5}, "instructions", INVALID),
    ({**OK, "instructions": "x" * 4097}, "instructions", TOO_LONG),
    ({**OK, "unknown_field": 1}, "unknown_field", UNKNOWN),
    ({**OK, "language": "English"}, "language", UNSUPPORTED),
    ({**OK, "task_type": "CustomVoice"}, "task_type", UNSUPPORTED),
    ({**OK, "max_new_tokens": 100}, "max_new_tokens", UNSUPPORTED),
    ({**OK, "initial_codec_chunk_frames": 2}, "initial_codec_chunk_frames", UNSUPPORTED),
    ({**OK, "seed": -1}, "seed", INVALID),
    ({**OK, "seed": 1.5}, "seed", INVALID),
    ({**OK, "ref_audio": DATA_URL}, "ref_audio", INVALID),
    ({**OK, "ref_text": "the words in the reference"}, "ref_text", INVALID),
    ({**OK, "ref_audio": "https://example.com/voice.wav"}, "ref_audio", INVALID),
    ({**OK, "x_vector_only_mode": "yes"}, "x_vector_only_mode", INVALID),
    ({**OK, "stream": "yes"}, "stream", INVALID),
    ({**OK, "stream": False, "stream_format": "sse"}, "stream", INVALID),
    ({**OK, "ignore_eos": 1}, "ignore_eos", INVALID),
    ({**OK, "ignore_eos": True}, "ignore_eos", UNSUPPORTED),
    # Lone surrogates (unencodable for Triton: they gave a plain-text 500) and NUL, in every string
    ({**OK, "input": "\ud800 hi"}, "input", INVALID),
    ({**OK, "input": "hi \udfff"}, "input", INVALID),
    ({**OK, "input": "hi\x00there"}, "input", INVALID),
    ({**OK, "model": "tts-1\ud800"}, "model", INVALID),
    ({**OK, "voice": "alloy\udbff"}, "voice", INVALID),
    ({**OK, "voice": {"id": "\udc00"}}, "voice", INVALID),
    ({**OK, "instructions": "calm \ud800"}, "instructions", INVALID),
    ({**OK, "response_format": "pcm\ud800"}, "response_format", INVALID),
    ({**OK, "stream_format": "sse\x00"}, "stream_format", INVALID),
    ({**OK, "language": "\ud800"}, "language", INVALID),
    ({**OK, "ref_text": "\x00"}, "ref_text", INVALID),
    # Numbers JSON allows and Python reads, that overflow or are not finite
    ({**OK, "speed": float("nan")}, "speed", INVALID),
    ({**OK, "speed": float("inf")}, "speed", INVALID),
    ({**OK, "speed": 10**400}, "speed", INVALID),
    ({**OK, "seed": 10**400}, "seed", INVALID),
    ({**OK, "seed": float("-inf")}, "seed", INVALID),
    # Keys that are no field name are not echoed as `param`
    ({**OK, "\ud800": 1}, None, UNKNOWN),
    ({**OK, "k" * 10_000: 1}, None, UNKNOWN),
    # Judged by Triton's entry model (the shim cannot know), then mapped onto the envelope
    ({**OK, "input": "\U0001F642"}, "input", INVALID),
    ({**QWEN3, "language": "klingon"}, "language", INVALID),
    ({**QWEN3, "task_type": "VoiceDesign"}, "task_type", INVALID),
    # Judged by the shim with the adapter's own validator
    ({**QWEN3, "max_new_tokens": 9000}, "max_new_tokens", INVALID),
    ({**QWEN3, "voice": "nobody"}, "voice", INVALID),
]


def test_instructions_a_checkpoint_drops_are_named_as_ignored(shim):
    """The 0.6B CustomVoice checkpoint (the tiny random one is of that size) follows no
    instructions: the reference drops them, and the speech API speaks without them and names them
    in x-omni-ignored-fields (PARAMS that carry them straight to Triton are refused)."""
    body = {**QWEN3, "seed": 1, "max_new_tokens": 6}
    told = post(shim, {**body, "instructions": "Speak calmly."})
    plain = post(shim, body)
    assert told.status_code == plain.status_code == 200, told.text[:300]
    assert told.headers["x-omni-ignored-fields"] == "instructions" and told.content == plain.content


@pytest.fixture(scope="module")
def shim_log_start(shim) -> int:
    """Where this module's part of the shared shim's log begins."""
    return len(shim.log_text())


@pytest.mark.parametrize("body,param,code", BAD_REQUESTS,
                         ids=[f"{p}-{i}" for i, (_, p, _) in enumerate(BAD_REQUESTS)])
def test_bad_fields_are_400_naming_the_field(shim, shim_log_start, body, param, code):
    error = envelope(post(shim, body), 400, "invalid_request_error", param, code)
    assert (param or "unknown field") in error["message"]


def test_clone_fields_say_the_model_does_not_clone(shim):
    r = httpx.post(f"{shim.url}/v1/audio/speech", json={**OK, "ref_audio": DATA_URL, "ref_text": "hi"})
    assert "does not clone voices" in envelope(r, 400, "invalid_request_error", "ref_audio")["message"]


def test_rejections_from_triton_are_real_400s(shim):
    """The shim cannot see this one: Triton's pipeline finds no words to speak. The status line
    waits for the first audio, so the client still gets a 400, not a broken 200."""
    r = httpx.post(f"{shim.url}/v1/audio/speech", json={**OK, "input": "\U0001F642"})
    error = envelope(r, 400, "invalid_request_error", "input")
    assert "nothing to speak" in error["message"]


JSON = {"content-type": "application/json"}
# (raw body, headers, status, param, code): bodies that do not decode to a speech request.
MALFORMED_BODIES = [
    (b"not json", JSON, 400, None, "invalid_json"),
    (b"", JSON, 400, None, "invalid_json"),
    (b"[1, 2]", JSON, 400, None, INVALID),
    (b"model=tts-1&input=hi&voice=alloy", {"content-type": "application/x-www-form-urlencoded"}, 400, None,
     "invalid_json"),
    (b"\xff\xfe", JSON, 400, None, "invalid_json"),
    (b"[" * 50_000, JSON, 400, None, "invalid_json"),          # was a 500 RecursionError
    (b"[" * 100_000, JSON, 400, None, "invalid_json"),
    (b'{"model": "tts-1", "input": ' + b"[" * 50_000, JSON, 400, None, "invalid_json"),
    (b'{"model": "tts-1", "input": "hi", "voice": "alloy", "seed": 1' + b"0" * 5000 + b"}", JSON, 400, None,
     "invalid_json"),                                           # Python refuses > 4300 digits
    (b'{"model": "tts-1", "input": "hi", "voice": "alloy", "speed": 1' + b"0" * 400 + b"}", JSON, 400, "speed",
     INVALID),                                                  # was a 500 OverflowError
    (b'{"model": "tts-1", "input": "\xed\xa0\x80 hi", "voice": "alloy"}', JSON, 400, "input", INVALID),
    (json.dumps({**OK, "ref_audio": "data:audio/wav;base64," + "A" * (25 * 1024 * 1024)}).encode(), JSON, 413, None,
     "request_too_large"),
]


@pytest.mark.parametrize("content,headers,status,param,code", MALFORMED_BODIES,
                         ids=[f"{s}-{c}-{i}" for i, (_, _, s, _, c) in enumerate(MALFORMED_BODIES)])
def test_malformed_bodies_are_400_never_422(shim, shim_log_start, content, headers, status, param, code):
    """json.loads decodes bytes with surrogatepass: b"\xed\xa0\x80" becomes a lone surrogate,
    which the field check names."""
    r = httpx.post(f"{shim.url}/v1/audio/speech", content=content, headers=headers, timeout=60)
    envelope(r, status, "invalid_request_error", param, code)


# (keyword arguments of audio.speech.create, param, code): the official SDK's view of the same.
SDK_CASES = [
    ({"input": "Hi.", "speed": 5.0}, "speed", INVALID),
    ({"input": "x" * 4097}, "input", TOO_LONG),
    ({"input": "Hi.", "voice": "he\x00art"}, "voice", INVALID),
    ({"input": "Hi.", "extra_body": {"seed": [[[[1]]]]}}, "seed", INVALID),
    ({"input": "Hi.", "extra_body": {"pitch": 2}}, "pitch", UNKNOWN),
    ({"input": "Hi.", "response_format": "ogg"}, "response_format", INVALID),
]


@pytest.mark.parametrize("kwargs,param,code", SDK_CASES, ids=[f"{p}-{i}" for i, (_, p, _) in enumerate(SDK_CASES)])
def test_sdk_sees_bad_request_with_param_and_code(openai_client, shim_log_start, kwargs, param, code):
    with pytest.raises(openai.BadRequestError) as bad:
        openai_client.audio.speech.create(**{"model": "tts-1", "voice": "alloy", **kwargs})
    assert (bad.value.status_code, bad.value.param, bad.value.code) == (400, param, code)
    assert bad.value.type == "invalid_request_error"


def test_after_the_bad_batch_good_requests_still_work(shim, openai_client, shim_log_start):
    assert len(httpx.post(f"{shim.url}/v1/audio/speech", json=OK, timeout=60).content) > 1000
    audio = openai_client.audio.speech.create(model="tts-1", voice="alloy", input="Still here.",
                                              response_format="wav")
    assert len(audio.content) > 1000
    log = shim.log_text()[shim_log_start:]
    assert "Traceback" not in log and "unhandled error" not in log, log[-3000:]
    assert not re.search(r'"POST /v1/audio/speech" 5\d\d ', log), log[-3000:]


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
    error = envelope(httpx.post(f"{shim.url}/v1/audio/speech", json={**OK, "model": "m" * 5000}), 404,
                     "invalid_request_error", "model", "model_not_found")
    assert "m" * 200 not in error["message"] and "..." in error["message"]   # a client's value, shortened


def test_an_unknown_voice_is_quoted_short(shim):
    error = envelope(httpx.post(f"{shim.url}/v1/audio/speech", json={**OK, "voice": "v" * 10_000}), 400,
                     "invalid_request_error", "voice")
    assert "unknown voice 'vvv" in error["message"] and len(error["message"]) < 1000
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
