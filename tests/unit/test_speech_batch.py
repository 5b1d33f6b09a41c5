"""vLLM-Omni's batch body: item fields over the shared ones, wav by default, at most
MAX_CONCURRENT_ITEMS spoken at once, an item's ApiError its own result."""
from __future__ import annotations

import asyncio

from client.speech_api.errors import invalid_request
from client.speech_api.speech_batch import MAX_CONCURRENT_ITEMS, batch_items, run_batch


def test_items_take_the_shared_fields_under_their_own():
    shared, bodies = batch_items({"voice": "a", "language": None, "items": [{"input": "x"},
                                                                          {"input": "y", "voice": "b",
                                                                           "response_format": "mp3"}]})
    assert shared == {"voice": "a"}
    assert bodies == [{"voice": "a", "input": "x", "response_format": "wav", "stream": False},
                      {"voice": "b", "input": "y", "response_format": "mp3", "stream": False}]


def test_items_run_a_few_at_a_time_and_fail_alone():
    running, peak = 0, 0

    async def speak(i, body):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        if i == 5:
            raise invalid_request("voice", "voice: unknown")
        return bytes([i]), "audio/wav"

    answer = asyncio.run(run_batch([{}] * 12, speak))
    assert peak == MAX_CONCURRENT_ITEMS
    assert (answer["total"], answer["succeeded"], answer["failed"]) == (12, 11, 1)
    assert answer["results"][5] == {"index": 5, "status": "error", "error": "voice: unknown",
                                    "code": "invalid_value", "param": "voice"}
    assert answer["results"][6]["audio_data"] == "Bg=="
