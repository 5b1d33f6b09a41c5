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
