"""Text that arrives while a Qwen3-TTS request runs, through a real tritonserver (`streaming_input`
+ `CONTROL=append`, omni_backend/triton/text_input.py).

Greedy audio for text given in pieces (1 character up to whole sentences, cut inside words,
English and Chinese, sent at once or at a pace slower than the talker reads) equals the audio of
the same text given whole in the first piece; the first audio leaves before the text is complete;
bad appends and pipelines that cannot append answer with coded errors; a request left without
text past `text_wait_s` ends with `invalid_request: text:` and frees its slot (gauges back to 0).
"""
from __future__ import annotations

import asyncio
import time
import uuid

import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient

from client.triton_stream import TritonStreamError
from client.triton_text_stream import TextInputStream
from tests.system.streamed_text import assert_text_wait_ends_the_stream, cuts
from tests.system.streaming_text_fixtures import GREEDY, QWEN, TEXT_WAIT_S

pytestmark = pytest.mark.system
pytest_plugins = ["tests.system.streaming_text_fixtures"]

ENGLISH = "Hello world, this is a streaming test. It speaks while an LLM is still writing!"
CHINESE = "你好，世界。今天天气很好，我们去公园散步吧！"
PARAMS = {"en": {"voice": "ryan", "language": "english", "max_new_tokens": 40, **GREEDY},
          "zh": {"voice": "eric", "language": "chinese", "max_new_tokens": 40, **GREEDY}}


async def _speak(url: str, pieces: list[str], delay_s: float, params: dict) -> dict:
    """One stream: the first piece opens it, the others follow every `delay_s`, then the end."""
    client = aioclient.InferenceServerClient(url)
    stream = TextInputStream(client, QWEN, params, uuid.uuid4().hex)
    chunks: list[np.ndarray] = []
    t0 = time.perf_counter()
    first: list[float] = []

    async def read():
        async for audio, _rate in stream.start(pieces[0]):
            first.append(first[0] if first else time.perf_counter() - t0)
            chunks.append(audio)

    reader = asyncio.ensure_future(read())
    try:
        for piece in pieces[1:]:
            if delay_s:
                await asyncio.sleep(delay_s)
            await stream.append(piece)
        complete = time.perf_counter() - t0
        await stream.end()
        await asyncio.wait_for(reader, 120)
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await client.close()
    return {"audio": np.concatenate(chunks), "first_s": first[0], "complete_s": complete}


def _sentences(text: str) -> list[str]:
    out, start = [], 0
    for i, ch in enumerate(text):
        if ch in ".!?。！？，,":
            out.append(text[start:i + 1])
            start = i + 1
    return out + ([text[start:]] if text[start:] else [])


@pytest.mark.parametrize("lang,text", [("en", ENGLISH), ("zh", CHINESE)])
def test_pieces_equal_whole_text(text_triton, lang, text):
    params = PARAMS[lang]
    whole = asyncio.run(_speak(text_triton.grpc_url, [text], 0, params))
    assert whole["audio"].size == (params["max_new_tokens"] - 1) * 1920
    cases = [(list(text), 0.0), (cuts(text, 1), 0.02), (cuts(text, 2), 0.0), (_sentences(text), 0.15)]
    for pieces, delay in cases:
        run = asyncio.run(_speak(text_triton.grpc_url, pieces, delay, params))
        assert np.array_equal(run["audio"], whole["audio"]), (pieces, delay)
        if delay >= 0.1:   # slower than the talker reads: it spoke before the text was complete
            assert run["first_s"] < run["complete_s"], run


def test_append_errors_are_coded(text_triton):
    async def scenario():
        client = aioclient.InferenceServerClient(text_triton.grpc_url)
        try:
            nowhere = TextInputStream(client, QWEN, PARAMS["en"], "no-such-stream")
            with pytest.raises(TritonStreamError, match="^invalid_request: request_id: no open stream"):
                await nowhere.append("hello")
            for model, params, field in (("hibari", {}, "streaming_input"),
                                         (QWEN, {**PARAMS["en"], "non_streaming_mode": True}, "non_streaming_mode")):
                stream = TextInputStream(client, model, params, uuid.uuid4().hex)
                with pytest.raises(TritonStreamError, match=f"^invalid_request: {field}:"):
                    async for _ in stream.start("Hello there."):
                        pass
        finally:
            await client.close()
    asyncio.run(scenario())


def test_text_wait_bound_ends_the_stream_and_frees_the_slot(text_triton):
    assert_text_wait_ends_the_stream(text_triton, QWEN, PARAMS["en"], TEXT_WAIT_S)
