"""Text streamed into a running request (`streaming_input`, omni_backend/triton/text_input.py) in
the system tests: the text cut in pieces, and the check of `text_wait_s`."""
from __future__ import annotations

import asyncio
import random
import time
import uuid

import pytest
import tritonclient.grpc.aio as aioclient

from client.triton_process import TritonProcess
from client.triton_stream import TritonStreamError
from client.triton_text_stream import TextInputStream
from tests.metrics_scrape import wait_for


def cuts(text: str, seed: int) -> list[str]:
    """`text` in pieces of 1 to 8 characters, cut anywhere (inside words too)."""
    rng, out, i = random.Random(seed), [], 0
    while i < len(text):
        n = rng.choice((1, 2, 3, 5, 8))
        out.append(text[i:i + n])
        i += n
    return out


def assert_text_wait_ends_the_stream(server: TritonProcess, pipeline: str, params: dict,
                                     text_wait_s: float) -> None:
    """Text that stops coming ends the stream with `invalid_request: text:` after `text_wait_s`,
    having spoken what it had, and frees the talker's slot."""
    async def scenario() -> tuple[list, float]:
        client = aioclient.InferenceServerClient(server.grpc_url)
        try:
            stream = TextInputStream(client, pipeline, params, uuid.uuid4().hex)
            got = []
            t0 = time.perf_counter()
            with pytest.raises(TritonStreamError, match="^invalid_request: text: .*text_wait_s"):
                async for audio, _ in stream.start("Hello world, and then nothing more "):
                    got.append(audio)
            return got, time.perf_counter() - t0
        finally:
            await client.close()

    got, took = asyncio.run(scenario())
    assert got and text_wait_s <= took < text_wait_s + 10   # it spoke what it had, then waited
    assert wait_for(server.metrics_url, "omni_stage_active_requests", 0, model=f"{pipeline}__talker") == 0
    assert wait_for(server.metrics_url, "omni_active_streams", 0, pipeline=pipeline) == 0
