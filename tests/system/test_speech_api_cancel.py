"""A client that goes away mid-stream cancels its Triton stream: the engine slot is freed long
before the text would have finished, and the server keeps serving."""
from __future__ import annotations

import time

import httpx
import pytest

from tests.system.speech_api_helpers import LONG_TEXT, metric, wait_for

pytest_plugins = ["tests.system.speech_api_fixtures"]
pytestmark = pytest.mark.system

# LONG_TEXT at half speed takes Triton several seconds to synthesize; a cancelled stream must
# be gone well before that.
CANCEL_WITHIN_S = 3.0


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
def test_disconnect_mid_stream_cancels_the_triton_stream(shim, triton, stream_format):
    cancelled = metric(triton, "omni_requests_total", pipeline="hibari", outcome="cancelled")
    request_id = f"cancel-me-{stream_format}"
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", f"{shim.url}/v1/audio/speech", headers={"x-request-id": request_id},
                           json={"model": "hibari", "voice": "heart", "input": LONG_TEXT, "speed": 0.5,
                                 "response_format": "pcm", "stream_format": stream_format}) as response:
            assert response.status_code == 200
            chunks = response.iter_raw()
            next(chunks)
            assert metric(triton, "omni_active_streams", pipeline="hibari") == 1
        # leaving the block closes the connection with most of the audio still to come
    t0 = time.monotonic()
    assert wait_for(lambda: metric(triton, "omni_active_streams", pipeline="hibari") == 0, CANCEL_WITHIN_S)
    assert wait_for(lambda: metric(triton, "omni_requests_total", pipeline="hibari",
                                   outcome="cancelled") > cancelled, CANCEL_WITHIN_S)
    assert time.monotonic() - t0 < CANCEL_WITHIN_S

    line = wait_for(lambda: [ln for ln in shim.log_text().splitlines() if request_id in ln], 5)
    assert line and "outcome=cancelled" in line[-1], shim.log_tail()
    assert httpx.get(f"{shim.url}/health").json()["tritons"][0]["active_streams"] == 0

    after = httpx.post(f"{shim.url}/v1/audio/speech",
                       json={"model": "tts-1", "voice": "alloy", "input": "Still here.", "response_format": "wav"})
    assert after.status_code == 200 and len(after.content) > 10000


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
def test_a_client_gone_before_the_first_byte_frees_its_stream(shim, triton, stream_format):
    """The request is sent whole and the connection closed at once: the speech API is still
    opening the Triton stream when the client leaves, and its body may never start. The Triton
    stream, the admission slot and the endpoint's count are all freed, with outcome=cancelled."""
    import json
    import socket

    from urllib.parse import urlsplit

    request_id = f"gone-early-{stream_format}"
    body = json.dumps({"model": "hibari", "voice": "heart", "input": LONG_TEXT, "speed": 0.5,
                       "response_format": "pcm", "stream_format": stream_format}).encode()
    url = urlsplit(shim.url)
    for n in range(5):   # several: the client's exit lands at different points of the opening
        with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
            sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                         + f"x-request-id: {request_id}-{n}\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
            time.sleep(0.05 * n)
    assert wait_for(lambda: metric(triton, "omni_active_streams", pipeline="hibari") == 0, 10 + CANCEL_WITHIN_S)
    assert wait_for(lambda: httpx.get(f"{shim.url}/health").json()["tritons"][0]["active_streams"] == 0, 5)
    lines = wait_for(lambda: (lambda found: found if len(found) == 5 else None)(
        [ln for ln in shim.log_text().splitlines() if f"{request_id}-" in ln and "outcome=" in ln]), 10)
    assert lines and all("outcome=cancelled" in ln for ln in lines), shim.log_tail()
    after = httpx.post(f"{shim.url}/v1/audio/speech",
                       json={"model": "tts-1", "voice": "alloy", "input": "Still here.", "response_format": "wav"})
    assert after.status_code == 200 and len(after.content) > 10000
