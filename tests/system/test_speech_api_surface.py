"""The rest of the HTTP surface: models, voices, health, request ids, CORS, the access log and
the web page's files."""
from __future__ import annotations

import time

import httpx
import pytest

from tests.system.speech_api_helpers import TEXT, decode, rms, wait_for

pytest_plugins = ["tests.system.speech_api_fixtures"]
pytestmark = pytest.mark.system


def test_models_lists_pipelines_and_openai_aliases(openai_client):
    models = {m.id: m for m in openai_client.models.list().data}
    assert {"hibari", "tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= set(models)
    assert models["tts-1"].model_extra["pipeline"] == "hibari"
    assert openai_client.models.retrieve("tts-1-hd").model_extra["pipeline"] == "hibari"


def test_voices_per_model(shim):
    body = httpx.get(f"{shim.url}/v1/audio/voices").json()
    assert body["model"] == "hibari" and body["voices"] == ["heart"] and body["default"] == "heart"
    assert body["models"]["hibari"] == ["heart"]
    assert body["clones_voices"] is False
    assert httpx.get(f"{shim.url}/v1/audio/voices", params={"model": "tts-1"}).json()["voices"] == ["heart"]
    missing = httpx.get(f"{shim.url}/v1/audio/voices", params={"model": "nope"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_a_request_without_model_speaks_the_default_model(shim):
    """vLLM-Omni's documented curl and httpx examples send no `model`: the default model answers
    (here hibari, the pipeline behind OpenAI's names), the same bytes as when named."""
    body = {"input": TEXT, "voice": "heart", "response_format": "wav", "seed": 1}
    unnamed = httpx.post(f"{shim.url}/v1/audio/speech", json=body, timeout=60)
    named = httpx.post(f"{shim.url}/v1/audio/speech", json={**body, "model": "hibari"}, timeout=60)
    assert unnamed.status_code == 200 and unnamed.headers["x-omni-model"] == "hibari"
    assert unnamed.content == named.content


def test_batch_speaks_each_item_as_a_single_request_would(shim):
    """vLLM-Omni's `POST /v1/audio/speech/batch`: shared fields, an item's own fields over them,
    each success the bytes of the same single request (`stream: false`), a bad item an error result
    of its own; a bad batch is a 400 naming its field."""
    import base64

    shared = {"model": "hibari", "voice": "heart", "seed": 3}
    items = [{"input": "The first line of the batch."},
             {"input": "A second one, faster, as flac.", "speed": 1.5, "response_format": "flac"},
             {"input": "A voice nobody has.", "voice": "nobody"}]
    r = httpx.post(f"{shim.url}/v1/audio/speech/batch", json={**shared, "items": items}, timeout=120)
    assert r.status_code == 200, r.text[:300]
    body = r.json()
    assert (body["total"], body["succeeded"], body["failed"]) == (3, 2, 1)
    first, second, bad = body["results"]
    assert [x["index"] for x in body["results"]] == [0, 1, 2]
    assert bad["status"] == "error" and bad["param"] == "voice"
    for result, item, media in ((first, items[0], "audio/wav"), (second, items[1], "audio/flac")):
        assert result["status"] == "success" and result["media_type"] == media
        single = httpx.post(f"{shim.url}/v1/audio/speech", timeout=60,
                            json={**shared, "response_format": "wav", **item, "stream": False})
        assert single.status_code == 200 and base64.b64decode(result["audio_data"]) == single.content
    for bad_body, param in (({**shared}, "items"), ({**shared, "items": []}, "items"),
                            ({**shared, "items": [{"input": "x"}] * 33}, "items"),
                            ({**shared, "items": [{"input": "x", "stream": True}]}, "items[0].stream"),
                            ({**shared, "items": [{"input": "x", "model": "hibari"}]}, "items[0].model"),
                            ({**shared, "stream_format": "sse", "items": [{"input": "x"}]}, "stream_format")):
        r = httpx.post(f"{shim.url}/v1/audio/speech/batch", json=bad_body, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (param, r.text[:200])
    r = httpx.post(f"{shim.url}/v1/audio/speech/batch", json={"model": "nope", "items": [{"input": "x"}]}, timeout=30)
    assert r.status_code == 404


def test_health_reflects_triton(shim, triton):
    r = httpx.get(f"{shim.url}/health")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok"
    [endpoint] = body["tritons"]
    assert endpoint["url"] == triton.grpc_url and endpoint["healthy"] is True
    assert "hibari" in endpoint["pipelines"] and endpoint["last_error"] is None
    assert "hibari" in body["models"] and "tts-1" in body["models"]


@pytest.mark.parametrize("voice", ["heart", {"id": "heart"}, "alloy", "NOVA"])
def test_voice_forms(openai_client, voice):
    """A pipeline voice, OpenAI's {"id"} form, and OpenAI stock names (the pipeline's default)."""
    response = openai_client.audio.speech.create(model="hibari", voice=voice, input="Hello.", response_format="wav")
    samples, _ = decode(response.content, "wav")
    assert rms(samples) > 0.01


def test_extension_seed_reaches_the_pipeline(openai_client):
    def wav(seed):
        return openai_client.audio.speech.create(model="hibari", voice="heart", input=TEXT,
                                                 response_format="wav", extra_body={"seed": seed}).content
    assert wav(7) == wav(7)


def test_request_id_is_echoed_or_made_and_logged(shim):
    mine = httpx.post(f"{shim.url}/v1/audio/speech", headers={"x-request-id": "trace-abc.123"},
                      json={"model": "tts-1", "input": "Hello.", "voice": "alloy", "response_format": "pcm"})
    assert mine.status_code == 200 and mine.headers["x-request-id"] == "trace-abc.123"
    assert mine.headers["x-omni-model"] == "hibari"
    assert float(mine.headers["x-omni-ttfa-ms"]) > 0
    made = httpx.get(f"{shim.url}/v1/models")
    assert len(made.headers["x-request-id"]) == 32
    bad = httpx.get(f"{shim.url}/v1/models", headers={"x-request-id": "no spaces allowed"})
    assert bad.headers["x-request-id"] != "no spaces allowed"
    err = httpx.post(f"{shim.url}/v1/audio/speech", json={"model": "tts-1"}, headers={"x-request-id": "err-1"})
    assert err.status_code == 400 and err.headers["x-request-id"] == "err-1"

    def logged():
        return [ln for ln in shim.log_text().splitlines() if "trace-abc.123" in ln]
    lines = wait_for(logged, 5)
    assert lines, shim.log_tail()
    line = lines[-1]
    assert '"POST /v1/audio/speech" 200' in line and "model=hibari" in line and "format=pcm" in line
    ttfa = line.split("ttfa_ms=")[1].split()[0]
    assert float(ttfa) > 0
    assert "outcome=ok" in line and "audio_s=" in line


def test_cors_preflight_reflects_the_sdk_headers(shim):
    asked = "authorization, content-type, x-stainless-os, x-stainless-lang, x-stainless-retry-count"
    r = httpx.options(f"{shim.url}/v1/audio/speech", headers={
        "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": asked})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] in ("*", "http://app.example")
    assert r.headers["access-control-allow-headers"] == asked
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "x-request-id" in r.headers
    simple = httpx.post(f"{shim.url}/v1/audio/speech", headers={"Origin": "http://app.example"},
                        json={"model": "tts-1", "input": "Hi.", "voice": "alloy", "response_format": "pcm"})
    assert simple.headers["access-control-allow-origin"] in ("*", "http://app.example")
    assert "x-request-id" in simple.headers["access-control-expose-headers"]


def test_page_and_script_are_served(shim):
    page = httpx.get(f"{shim.url}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'id="play"' in page.text and "/static/app.js" in page.text
    script = httpx.get(f"{shim.url}/static/app.js")
    assert script.status_code == 200 and "AudioContext" in script.text


def test_an_idle_connection_outlives_the_clients_own_keep_alive(shim):
    """A server that closes idle connections no later than its clients do races them: a request
    sent as the server closes fails with a cut connection. One connection, idle past httpx's
    (and uvicorn's default) 5 s, still serves the next request."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(shim.url)
    request = f"GET /v1/models HTTP/1.1\r\nHost: {url.netloc}\r\n\r\n".encode()

    def answer(sock: socket.socket) -> bytes:
        head = b""
        while b"\r\n\r\n" not in head:
            part = sock.recv(65536)
            assert part, "the server closed the connection"
            head += part
        header, _, body = head.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in header.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(body) < length:
            body += sock.recv(65536)
        return header.split(b"\r\n")[0]

    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(request)
        assert answer(sock) == b"HTTP/1.1 200 OK"
        time.sleep(7)
        sock.sendall(request)
        assert answer(sock) == b"HTTP/1.1 200 OK"
