"""`POST /v1/chat/completions` over a real tritonserver and the real speech API, on the toy family
(tests/toy_family: its writer streams TEXT_DELTA pieces of the input interleaved with the audio
its other stages make; `return_audio: false` skips them), its catalog marked `chat`: the route's
shape does not depend on one model. The toy "answers" with its input, so every text and sample is
known exactly. The Qwen3-Omni pipeline itself: test_speech_api_chat.py."""
from __future__ import annotations

import base64
import io
import json
import time

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

from tests.system.speech_api_fixtures import served_stack
from tests.system.speech_api_helpers import decode, metric, sse_events, wait_for
from tests.toy_family import PIPELINE, build_repository, expected_audio, text_pieces

pytestmark = pytest.mark.system
TEXT = "Hello from the toy chat. It answers with what it was told."
USER = [{"role": "user", "content": TEXT}]
QUANTUM = 2.0 / 32767   # s16 encoding (x 32767) decoded as x / 32768


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The toy pipeline built into a repository whose catalog says `chat`, a tritonserver on it
    and a speech API in front."""
    base = tmp_path_factory.mktemp("toy_chat")
    repo = build_repository(base / "model_repository")
    config = repo / PIPELINE / "config.pbtxt"
    text = config.read_text()
    assert '{\\"clones_voices\\":false,' in text
    config.write_text(text.replace('{\\"clones_voices\\":false,', '{\\"chat\\":true,\\"clones_voices\\":false,'))
    with served_stack(repo, base) as stack:
        yield stack


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=f"{stack[1].url}/v1", api_key="not-needed", max_retries=0, timeout=60)


def test_models_say_which_model_chats(stack):
    models = httpx.get(f"{stack[1].url}/v1/models").json()["data"]
    assert [(m["id"], m["chat"]) for m in models] == [(PIPELINE, True)]
    assert httpx.get(f"{stack[1].url}/v1/models/{PIPELINE}").json()["chat"] is True


def test_streamed_text_and_audio_with_the_sdk(client):
    stream = client.chat.completions.create(model=PIPELINE, messages=USER, modalities=["text", "audio"],
                                            audio={"voice": "bright", "format": "wav"}, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content is None
    audio_deltas = [c.choices[0].delta.audio for c in chunks if c.choices and c.choices[0].delta.audio]
    transcript = [a.transcript for a in audio_deltas if a.transcript is not None]
    assert transcript == text_pieces(TEXT)           # one delta per piece the writer wrote
    ids = [a.id for a in audio_deltas if a.id is not None]
    assert len(ids) == 1 and ids[0].startswith("audio_")
    assert audio_deltas[-1].expires_at > time.time()
    data = [base64.b64decode(a.data) for a in audio_deltas if a.data is not None]
    assert all(len(d) % 6 == 0 for d in data[:-1])
    samples, rate = decode(b"".join(data), "wav")
    assert rate == 8000
    np.testing.assert_allclose(samples, expected_audio(TEXT, 1.0), atol=QUANTUM)
    # text comes interleaved with the audio: not all text before the first audio
    kinds = ["text" if a.transcript is not None else "audio" for a in audio_deltas if a.transcript or a.data]
    assert kinds[0] == "text" and kinds.index("audio") < len(kinds) - kinds[::-1].index("text") - 1
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens_details.audio_tokens > 0
    assert all(c.id == chunks[0].id and c.id.startswith("chatcmpl-") for c in chunks)


def test_pcm16_is_24khz_and_streams(stack):
    body = {"model": PIPELINE, "messages": USER, "modalities": ["text", "audio"],
            "audio": {"voice": "alloy", "format": "pcm16"}, "stream": True}
    with httpx.stream("POST", f"{stack[1].url}/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    assert text.endswith("data: [DONE]\n\n")
    events = sse_events(text.replace("data: [DONE]", ""))
    audio = b"".join(base64.b64decode(e["choices"][0]["delta"]["audio"]["data"]) for e in events
                     if e["choices"] and "data" in e["choices"][0]["delta"].get("audio", {}))
    samples = np.frombuffer(audio, "<i2")
    expected = expected_audio(TEXT, 1.0)
    assert abs(samples.size - expected.size * 3) <= 48    # 8 kHz resampled to OpenAI's 24 kHz


def test_whole_answer_with_audio(client):
    answer = client.chat.completions.create(model=PIPELINE, messages=USER, modalities=["text", "audio"],
                                            audio={"voice": "plain", "format": "wav"}, extra_body={"gain": 0.5})
    message = answer.choices[0].message
    assert answer.object == "chat.completion" and answer.choices[0].finish_reason == "stop"
    assert message.content is None and message.audio.transcript == TEXT
    wav = base64.b64decode(message.audio.data)
    samples, rate = sf.read(io.BytesIO(wav), dtype="float32")   # sizes filled in: a whole file
    assert rate == 8000 and sf.info(io.BytesIO(wav)).frames == samples.size
    np.testing.assert_allclose(samples, expected_audio(TEXT, 0.5), atol=QUANTUM)
    assert answer.usage.prompt_tokens > 0 and answer.usage.completion_tokens > 0


def test_text_only_has_no_audio(client):
    answer = client.chat.completions.create(model=PIPELINE, messages=USER)
    assert answer.choices[0].message.content == TEXT and answer.choices[0].message.audio is None
    chunks = list(client.chat.completions.create(model=PIPELINE, messages=USER, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == TEXT
    assert not any(c.choices[0].delta.audio for c in chunks)


@pytest.mark.parametrize("extra, param", [
    ({"n": 2}, "n"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"logprobs": True}, "logprobs"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"stop": ["."]}, "stop"),
    ({"modalities": ["text", "audio"], "speaker": "nobody"}, "speaker"),   # no audio object: speaker, wav
    ({"modalities": ["text", "audio"], "audio": {"voice": "plain", "format": "ogg"}}, "audio.format"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "nobody", "format": "wav"}}, "audio.voice"),
    ({"audio": {"voice": "plain", "format": "wav"}}, "audio"),
    ({"messages": [{"role": "assistant", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0].image_url.url"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "data:image/png;base64,iVBORw0KGgo="}}]}]}, "messages[0].content"),   # a model without media
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                   {"role": "user", "content": "c"}]}, "messages"),   # the toy takes no history
    ({"gain": 9}, "gain"),
    ({"wobble": 1}, "wobble"),
    ({"speaker": "plain"}, "speaker"),
    ({"temperature": 3}, "temperature"),
    ({"model": "nothing-here"}, "model"),
])
def test_bad_fields_are_400s_naming_them(stack, extra, param):
    body = {"model": PIPELINE, "messages": USER, **extra}
    r = httpx.post(f"{stack[1].url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param, r.text


def test_speech_route_refuses_a_chat_model(stack):
    r = httpx.post(f"{stack[1].url}/v1/audio/speech", json={"model": PIPELINE, "input": "Hi.", "voice": "plain"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert "/v1/chat/completions" in r.json()["error"]["message"]


def test_failure_mid_stream_is_an_error_event(stack, client):
    """The toy writer fails after two pieces when asked: after the status line for a stream, an
    error event ends it; for a whole answer, the status is the error's."""
    body = {"model": PIPELINE, "messages": USER, "stream": True, "fail_after": 2}
    with httpx.stream("POST", f"{stack[1].url}/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        events = sse_events(r.read().decode())
    assert events[-1]["error"]["param"] == "fail_after" and "[DONE]" not in json.dumps(events)
    with pytest.raises(openai.APIError) as e:
        list(client.chat.completions.create(model=PIPELINE, messages=USER, stream=True,
                                            extra_body={"fail_after": 2}))
    assert "fail_after" in str(e.value)
    r = httpx.post(f"{stack[1].url}/v1/chat/completions", timeout=30,
                   json={"model": PIPELINE, "messages": USER, "fail_after": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "fail_after"


@pytest.mark.parametrize("stream", [True, False])
def test_hang_up_frees_the_triton_stream(stack, stream):
    server, shim = stack
    long_text = "A long answer that is still being written when the client leaves. " * 60   # ~14 s of pieces
    body = {"model": PIPELINE, "messages": [{"role": "user", "content": long_text[:4000]}], "stream": stream,
            "modalities": ["text", "audio"], "audio": {"voice": "plain", "format": "pcm16"}}
    request_id = f"chat-hang-up-{stream}"
    # the earlier tests' streams are over (their end is counted a moment after their last byte)
    assert wait_for(lambda: metric(server, "omni_active_streams", pipeline=PIPELINE) == 0, 5.0)
    with httpx.Client(timeout=30, headers={"x-request-id": request_id}) as http:
        if stream:
            with http.stream("POST", f"{shim.url}/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                chunks = r.iter_raw()   # kept: a closed byte iterator closes the connection
                next(chunks)
                assert wait_for(lambda: metric(server, "omni_active_streams", pipeline=PIPELINE) == 1, 2.0)
        else:
            with pytest.raises(httpx.ReadTimeout):
                http.post(f"{shim.url}/v1/chat/completions", json=body, timeout=1.5)
    assert wait_for(lambda: metric(server, "omni_active_streams", pipeline=PIPELINE) == 0, 3.0)
    line = wait_for(lambda: [ln for ln in shim.log_text().splitlines() if request_id in ln], 5)
    assert line and "outcome=cancelled" in line[-1], shim.log_tail()
    assert httpx.get(f"{shim.url}/health").json()["tritons"][0]["active_streams"] == 0


def test_page_chat_box_streams_text_and_plays_audio(stack, tmp_path):
    """The web page in headless Chromium: a chat model shows the chat box; a message's answer
    streams in as text while its pcm16 audio plays, and the turn joins the page's history."""
    import os

    from tests.system.chromium_cdp import CHROMIUM, Chromium

    assert os.path.exists(CHROMIUM), "the page test needs Debian's chromium (apt-get install -y chromium)"
    browser = Chromium().start()
    try:
        browser.navigate(f"{stack[1].url}/")
        browser.wait_for("window.omniSpeech && window.omniSpeech.ready && window.omniSpeech.mode === 'chat'", 15)
        assert browser.evaluate("document.getElementById('chat').hidden") is False
        assert browser.evaluate("document.getElementById('text').hidden") is True
        browser.wait_for("document.getElementById('voice').value === 'plain'", 5)
        browser.evaluate(f"document.getElementById('chat-input').value = {json.dumps(TEXT)}")
        browser.click("#chat-send")
        browser.wait_for("['done', 'error'].includes(window.omniSpeech.chat.phase)", 30)
        state = json.loads(browser.evaluate("JSON.stringify(window.omniSpeech.chat)"))
        browser.screenshot(tmp_path / "chat.png")
        assert state["phase"] == "done", state["error"]
        assert state["answer"] == TEXT
        assert state["history"] == [{"role": "user", "content": TEXT}, {"role": "assistant", "content": TEXT}]
        assert state["audioSeconds"] == pytest.approx(expected_audio(TEXT, 1.0).size / 8000, abs=0.01)
        assert state["firstTextMs"] is not None and state["firstAudioMs"] is not None
        shown = browser.evaluate("[...document.querySelectorAll('#chat-log .turn')].map(t => t.textContent)")
        assert shown == [TEXT, TEXT]
    finally:
        browser.stop()
