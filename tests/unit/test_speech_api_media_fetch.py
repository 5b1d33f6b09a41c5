"""Image URLs of chat messages: fetched only from allowed hosts, within limits, never from private
addresses unless allowed; every refusal a 400 naming the part. Against a real local HTTP server."""
from __future__ import annotations

import asyncio
import base64
import http.server
import threading
import time

import pytest

from client.speech_api.errors import ApiError
from client.speech_api.media_fetch import FetchPolicy, fetch_message_media

PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==")


WAV = b"RIFF$\0\0\0WAVEfmt \x10\0\0\0\x01\0\x01\0\x80>\0\0\0}\0\0\x02\0\x10\0data\0\0\0\0"


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, kind: str, body: bytes, headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):   # a fetch that stops reading (over its limit)
            pass

    def do_GET(self) -> None:
        routes = {
            "/cat.png": lambda: self._send(200, "image/png", PNG),
            "/hello.wav": lambda: self._send(200, "audio/wav", WAV),
            "/redirect": lambda: self._send(302, "text/plain", b"", {"Location": "/cat.png"}),
            "/loop": lambda: self._send(302, "text/plain", b"", {"Location": "/loop"}),
            "/page": lambda: self._send(200, "text/html", b"<html></html>"),
            "/huge": lambda: self._send(200, "image/png", PNG + b"\0" * 200_000),
            "/missing": lambda: self._send(404, "text/plain", b"no"),
        }
        if self.path == "/slow":
            time.sleep(3)
            self._send(200, "image/png", PNG)
            return
        routes.get(self.path, routes["/missing"])()


@pytest.fixture(scope="module")
def site():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


LOCAL = FetchPolicy(allowed_hosts=("127.0.0.1",), allow_private=True, max_bytes=100_000, timeout_s=1.0)


def _fetch(url: str, policy: FetchPolicy) -> dict:
    part = {"type": "image_url", "image_url": {"url": url}}
    asyncio.run(fetch_message_media([(0, "hi"), (1, [{"type": "text", "text": "x"}, part])], policy))
    return part


def _refused(url: str, policy: FetchPolicy) -> str:
    with pytest.raises(ApiError) as error:
        _fetch(url, policy)
    assert error.value.status == 400 and error.value.param == "messages[1].content[1].image_url.url"
    return error.value.message


def test_an_allowed_url_becomes_a_data_url(site):
    assert _fetch(f"{site}/cat.png", LOCAL)["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert _fetch(f"{site}/redirect", LOCAL)["image_url"]["url"].startswith("data:image/png;base64,")
    data = "data:image/png;base64,AAAA"
    assert _fetch(data, FetchPolicy())["image_url"]["url"] == data   # data URLs are left alone


@pytest.mark.parametrize("path, policy, message", [
    ("/cat.png", FetchPolicy(), "fetches no URL"),
    ("/cat.png", FetchPolicy(allowed_hosts=("images.example.com",)), "not one this server fetches from"),
    ("/cat.png", FetchPolicy(allowed_hosts=("127.0.0.1",)), "private or loopback"),
    ("/page", LOCAL, "not an image"),
    ("/huge", LOCAL, "larger than 100000 bytes"),
    ("/missing", LOCAL, "HTTP 404"),
    ("/loop", LOCAL, "redirects more than 3 times"),
    ("/slow", LOCAL, "longer than 1 s"),
])
def test_refusals_name_the_part(site, path, policy, message):
    started = time.monotonic()
    assert message in _refused(f"{site}{path}", policy)
    assert time.monotonic() - started < 3.0   # a slow host does not hold the request


def test_schemes_credentials_and_closed_ports(site):
    assert "or an http(s) URL" in _refused("ftp://127.0.0.1/x.png", LOCAL)
    assert "credentials" in _refused(site.replace("http://", "http://user:pw@") + "/cat.png", LOCAL)
    assert "could not be fetched" in _refused("http://127.0.0.1:9/x.png", LOCAL)


def test_subdomain_patterns():
    policy = FetchPolicy(allowed_hosts=("*.example.com", "cdn.test"))
    assert policy.host_allowed("a.example.com") and policy.host_allowed("cdn.test")
    assert not policy.host_allowed("example.com.evil.org") and not policy.host_allowed("evilexample.com")


def test_an_audio_url_becomes_an_input_audio_part(site):
    """vLLM's `audio_url` parts: fetched as images are (an audio/* answer only), then sent on as
    the `input_audio` part the pipelines take; a data URL is sent on as it is."""
    part = {"type": "audio_url", "audio_url": {"url": f"{site}/hello.wav"}}
    where = asyncio.run(fetch_message_media([(0, [part])], LOCAL))
    assert where == ("messages[0].content[0]",)
    assert part == {"type": "input_audio", "input_audio": {"data": "data:audio/wav;base64," + base64.b64encode(WAV).decode()}}
    data = {"type": "audio_url", "audio_url": {"url": "data:audio/ogg;base64,T2dnUw=="}}
    asyncio.run(fetch_message_media([(0, [data])], FetchPolicy()))
    assert data == {"type": "input_audio", "input_audio": {"data": "data:audio/ogg;base64,T2dnUw=="}}
    for url, policy, message in ((f"{site}/cat.png", LOCAL, "is not audio"), (f"{site}/hello.wav", FetchPolicy(),
                                                                               "fetches no URL")):
        with pytest.raises(ApiError) as error:
            asyncio.run(fetch_message_media([(0, [{"type": "audio_url", "audio_url": {"url": url}}])], policy))
        assert error.value.param == "messages[0].content[0].audio_url.url" and message in error.value.message
