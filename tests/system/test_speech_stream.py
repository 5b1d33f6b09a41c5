"""`WS /v1/audio/speech/stream` through the speech API and a real tritonserver, with the
`websockets` client (client/speech_stream_client.py).

* append: greedy audio for text sent in pieces (1 character up to sentences, cut inside words,
  English and Chinese, at once or paced) equals the audio of the same text sent whole, and audio
  starts before input.done; 8 concurrent sessions each equal their solo run;
* sentence mode on hibari speaks each sentence intelligibly (pocketsphinx), one audio.start /
  audio.done per sentence, session.done with the count; utterances follow on one connection;
* append on a pipeline that cannot append, a bad config, text over the limit: coded errors;
* a client that disconnects mid-utterance, and an idle session, free the Triton stream
  (gauges back to 0).
"""
from __future__ import annotations

import asyncio
import base64
import random
import re
import time

import numpy as np
import pytest

from client.speech_stream_client import SpeechStreamClient, ws_url
from tests.asr import transcribe, word_error_rate
from tests.metrics_scrape import metric
from tests.system.streaming_text_fixtures import GREEDY, QWEN

pytestmark = pytest.mark.system
pytest_plugins = ["tests.system.streaming_text_fixtures"]

ENGLISH = "Hello world, this is a streaming test. It speaks while an LLM is still writing!"
CHINESE = "你好，世界。今天天气很好，我们去公园散步吧！"
APPEND = {"model": QWEN, "voice": "ryan", "language": "english", "response_format": "pcm",
          "split_granularity": "append", "max_new_tokens": 30, "sampling": {"do_sample": False, "subtalker_do_sample": False}}


def _config(**over) -> dict:
    return {**APPEND, **over}


def _words(text: str) -> list[str]:
    return re.findall(r"\S+\s*", text)


async def _utterance(url: str, config: dict, pieces: list[str], delay_s: float = 0.0):
    async with SpeechStreamClient(url, config) as session:
        for piece in pieces:
            if delay_s:
                await asyncio.sleep(delay_s)
            await session.send_text(piece)
        sent_all = time.perf_counter()
        utterance = await session.finish()
        return utterance, sent_all


def _cuts(text: str, seed: int) -> list[str]:
    rng, out, i = random.Random(seed), [], 0
    while i < len(text):
        n = rng.choice((1, 2, 4, 7))
        out.append(text[i:i + n])
        i += n
    return out


def _gauges_zero(triton, within_s: float = 30.0) -> bool:
    # within 30 s: the session's 2-s send timeout, then the cancel through the speech API, the entry
    # and the talker, on a host that runs other servers' tests beside it (over 15 s twice in a full
    # parallel run, never alone); a caller that needs the cut-off also checks the client did not
    # get the whole utterance
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        streams = metric(triton.metrics_url, "omni_active_streams", pipeline=QWEN)
        talker = metric(triton.metrics_url, "omni_stage_active_requests", model=f"{QWEN}__talker")
        if streams == 0 and talker == 0:
            return True
        time.sleep(0.2)
    print(f"after {within_s:g} s: omni_active_streams {streams}, the talker's active requests {talker}")
    return False


@pytest.mark.parametrize("lang,text,voice", [("english", ENGLISH, "ryan"), ("chinese", CHINESE, "eric")])
def test_append_pieces_equal_whole(text_shim, lang, text, voice):
    url = ws_url(text_shim.url)
    config = _config(language=lang, voice=voice)
    whole, _ = asyncio.run(_utterance(url, config, [text]))
    assert not whole.errors, whole.errors
    assert len(whole.audio) == (config["max_new_tokens"] - 1) * 1920 * 2
    kinds = [m["type"] for m in whole.messages]
    assert kinds == ["audio.start", "audio.done", "session.done"], kinds
    for pieces, delay in ((list(text), 0.0), (_cuts(text, 1), 0.01), (_words(text), 0.05)):
        run, _ = asyncio.run(_utterance(url, config, pieces, delay))
        assert not run.errors, run.errors
        assert run.audio == whole.audio, (pieces, delay)


def test_vllm_omni_streaming_modes_and_commits(text_shim):
    """vLLM-Omni's newer clients: `streaming_mode: token_level` or `sentence_commit` with
    `input.commit` after each sentence. On a pipeline that reads text as it arrives both are
    append mode (the same audio as `split_granularity: append`), each commit answered
    `input.committed` with its id and index; on one that cannot (hibari) each sentence is spoken
    once complete, a commit speaking what was held back."""
    url = ws_url(text_shim.url)
    sentences = ["Hello world, this is a streaming test.", " It speaks while an LLM is still writing!"]
    append, _ = asyncio.run(_utterance(url, _config(), sentences))

    async def committed(config: dict):
        async with SpeechStreamClient(url, config) as session:
            for i, sentence in enumerate(sentences):
                await session.send_text(sentence)
                await session.commit(f"sentence-{i}")
            return await session.finish()

    base = {k: v for k, v in APPEND.items() if k != "split_granularity"}
    for mode in ("token_level", "sentence_commit"):
        run = asyncio.run(committed({**base, "streaming_mode": mode}))
        assert not run.errors, run.errors
        acks = [m for m in run.messages if m["type"] == "input.committed"]
        assert [(m["commit_id"], m["sentence_index"]) for m in acks] == [("sentence-0", 0), ("sentence-1", 1)]
        assert run.audio == append.audio, mode
    hibari = asyncio.run(committed({"model": "hibari", "streaming_mode": "sentence_commit", "response_format": "pcm"}))
    assert not hibari.errors, hibari.errors
    said = [m["sentence_text"] for m in hibari.messages if m["type"] == "audio.start"]
    assert said == [s.strip() for s in sentences] and hibari.audio

    async def refused():
        async with SpeechStreamClient(url, {**base, "streaming_mode": "word_level"}) as session:
            return await session.wait_message("error", 30)
    assert asyncio.run(refused()).message["param"] == "streaming_mode"


def test_append_audio_starts_before_the_text_is_complete(text_shim):
    run, sent_all = asyncio.run(_utterance(ws_url(text_shim.url), _config(), _words(ENGLISH), 0.25))
    first_audio = next(r.at for r in run.received if r.audio)
    assert first_audio < sent_all, (first_audio, sent_all)


def test_eight_concurrent_sessions_equal_solo(text_shim):
    url = ws_url(text_shim.url)
    texts = [f"Session number {i} says hello, and then a little more." for i in range(8)]
    voices = ["ryan", "vivian", "serena", "aiden", "eric", "dylan", "ryan", "vivian"]

    async def solo_runs():
        return [(await _utterance(url, _config(voice=v), [t]))[0].audio for t, v in zip(texts, voices)]

    async def together():
        runs = await asyncio.gather(*(_utterance(url, _config(voice=v), _cuts(t, i), 0.01)
                                      for i, (t, v) in enumerate(zip(texts, voices))))
        return [u.audio for u, _ in runs]

    solo = asyncio.run(solo_runs())
    both = asyncio.run(together())
    for i, (a, b) in enumerate(zip(solo, both)):
        assert a and a == b, i


def test_sentence_mode_on_hibari_is_intelligible(text_shim):
    sentences = ["Hello there, this is the first sentence.", "The weather is nice today."]
    config = {"model": "hibari", "voice": "heart", "response_format": "pcm", "split_granularity": "sentence"}

    async def scenario():
        async with SpeechStreamClient(ws_url(text_shim.url), config) as session:
            for word in " ".join(sentences).split(" "):
                await session.send_text(word + " ")
            first = await session.finish()
            await session.send_text("A second utterance.")   # the connection stays
            second = await session.finish()
            return first, second

    first, second = asyncio.run(scenario())
    assert not first.errors and not second.errors
    starts = [m for m in first.messages if m["type"] == "audio.start"]
    assert [m["sentence_text"] for m in starts] == sentences
    assert [m["sentence_index"] for m in starts] == [0, 1]
    done = first.messages[-1]
    assert done == {"type": "session.done", "utterance_index": 0, "total_sentences": 2}
    for text, audio in zip(sentences, first.sentence_audio()):
        samples = np.frombuffer(audio, "<i2").astype(np.float32) / 32768.0
        assert word_error_rate(text, transcribe(samples, 24000)) <= 0.25, text
    assert second.messages[-1] == {"type": "session.done", "utterance_index": 1, "total_sentences": 1}


def test_an_utterance_longer_than_one_request_is_spoken(text_shim):
    """One request takes 4,096 characters. Sentence mode cuts a longer run without a sentence end
    at whitespace; append mode sends a longer first piece, and pieces that queued up past the
    limit, in slices (both were refused before, append only after the talker waited 30 s)."""
    url = ws_url(text_shim.url)
    words = "word " * 1000
    hibari = {"model": "hibari", "voice": "heart", "response_format": "pcm", "split_granularity": "sentence"}
    run, _ = asyncio.run(_utterance(url, hibari, [words[i:i + 5] for i in range(0, len(words), 5)]))
    assert not run.errors, run.errors
    texts = [m["sentence_text"] for m in run.messages if m["type"] == "audio.start"]
    assert len(texts) == 2 and max(map(len, texts)) <= 4096 and " ".join(texts).split() == words.split()
    assert all(run.sentence_audio())

    text = "Hello there, how are you today? " * 300          # 9,600 characters
    started = time.monotonic()
    run, _ = asyncio.run(_utterance(url, _config(), [text[:6000]] + _cuts(text[6000:], 3)))
    assert not run.errors, run.errors
    assert time.monotonic() - started < 25
    assert len(run.audio) == (APPEND["max_new_tokens"] - 1) * 1920 * 2
    assert [m["type"] for m in run.messages] == ["audio.start", "audio.done", "session.done"]
    assert run.messages[1]["sentence_text"] == text


def test_text_after_an_append_request_reached_its_frame_limit_is_not_an_error(text_shim, text_triton):
    """The request reaches max_new_tokens while the client still writes: its audio is complete,
    the text that follows has nowhere to go (as a whole request's text past its frame limit), and
    the utterance ends at the client's input.done without an error; appends to the ended stream
    are not made to wait (the entry would look for it 5 s each)."""
    url = ws_url(text_shim.url)
    first, later = "Hello there, this utterance outlives its frame limit. ", ["And goes on ", "and on."]

    async def scenario():
        async with SpeechStreamClient(url, _config(max_new_tokens=5)) as session:
            await session.send_text(first)
            assert await asyncio.to_thread(_gauges_zero, text_triton)   # the request ended
            t0 = time.monotonic()
            for piece in later:
                await session.send_text(piece)
                await asyncio.sleep(0.2)
            utterance = await session.finish()
            return utterance, time.monotonic() - t0

    run, took = asyncio.run(scenario())
    assert not run.errors, run.errors
    assert [m["type"] for m in run.messages] == ["audio.start", "audio.done", "session.done"], run.messages
    done = run.messages[1]
    assert done["error"] is False and done["sentence_text"] == first + "".join(later), done
    assert len(run.audio) == 4 * 1920 * 2 and took < 4.0, (len(run.audio), took)


def test_coded_errors(text_shim):
    async def first_error(config: dict, text: str | None = None) -> dict:
        async with SpeechStreamClient(ws_url(text_shim.url), config) as session:
            if text is not None:
                await session.send_text(text)
            return (await session.wait_message("error", 30)).message

    error = asyncio.run(first_error({"model": "hibari", "voice": "heart", "split_granularity": "append"}))
    assert error["code"] == "invalid_request" and error["param"] == "split_granularity", error
    assert error["message"].startswith("invalid_request: split_granularity:"), error
    error = asyncio.run(first_error({"model": "nope"}))
    assert error["code"] == "invalid_request" and error["param"] == "model", error
    error = asyncio.run(first_error(_config(), "x" * 70000))
    assert error["code"] == "invalid_request" and error["param"] == "input.text", error


def test_disconnect_and_idle_timeout_free_the_stream(text_shim, text_triton):
    url = ws_url(text_shim.url)

    async def hang_up():
        async with SpeechStreamClient(url, _config(max_new_tokens=200)) as session:
            await session.send_text("A long text whose speaker hangs up after the first audio. ")
            deadline = time.monotonic() + 60
            while not any(r.audio for r in session.received):   # an error or silence fails, not hangs
                errors = [r.message for r in session.received if r.message and r.message.get("type") == "error"]
                assert not errors and time.monotonic() < deadline, errors or "no audio within 60 s"
                await asyncio.sleep(0.05)
            assert metric(text_triton.metrics_url, "omni_active_streams", pipeline=QWEN) == 1
        # the socket is closed here, mid-utterance

    asyncio.run(hang_up())
    assert _gauges_zero(text_triton)

    async def go_idle():
        async with SpeechStreamClient(url, _config()) as session:
            error = await session.wait_message("error", 30)   # idle: the shim's 3 s
            await asyncio.sleep(0.5)
            return error.message, session.closed

    message, closed = asyncio.run(go_idle())
    assert message["code"] == "invalid_request" and "idle" in message["message"], message
    assert closed is not None
    assert _gauges_zero(text_triton)


def test_a_client_that_reads_nothing_is_cut_off(text_shim, text_triton):
    """Back-pressure: audio is pulled from Triton only as fast as the client takes it; a client
    that takes nothing for the send timeout (2 s here) loses its session and its Triton stream,
    long before the utterance's audio could have been buffered for it."""
    import json as _json

    from websockets.asyncio.client import connect

    frames = 3000
    full = (frames - 1) * 1920 * 2 * 2   # pcm at 48 kHz

    async def scenario():
        async with connect(ws_url(text_shim.url), max_queue=1, max_size=None) as ws:
            await ws.send(_json.dumps({"type": "session.config", **_config(max_new_tokens=frames, sample_rate=48000)}))
            await ws.send(_json.dumps({"type": "input.text", "text": "A client that never listens. "}))
            await ws.send(_json.dumps({"type": "input.done"}))
            await asyncio.sleep(1.0)
            assert metric(text_triton.metrics_url, "omni_active_streams", pipeline=QWEN) == 1
            stopped = await asyncio.to_thread(_gauges_zero, text_triton)   # cut off while we read nothing
            received = 0
            try:
                async for data in ws:
                    received += len(data) if isinstance(data, bytes) else 0
            except Exception:  # noqa: BLE001 - the server closed it
                pass
            return stopped, received

    stopped, received = asyncio.run(scenario())
    assert stopped
    assert received < full, received


async def _exchange(url: str, messages: list, dones: int, timeout_s: float = 60.0) -> list:
    """Send each message (a dict as JSON, or a raw str), then read until `dones` session.done
    messages or the server closes; returns what came (dicts, bytes), in order."""
    import json as _json

    from websockets.asyncio.client import connect

    got: list = []
    async with connect(url, max_size=None) as ws:
        for m in messages:
            await ws.send(m if isinstance(m, str) else _json.dumps(m))

        async def read() -> None:
            async for data in ws:
                got.append(data if isinstance(data, bytes) else _json.loads(data))
                if sum(isinstance(g, dict) and g["type"] == "session.done" for g in got) >= dones:
                    return
        await asyncio.wait_for(read(), timeout_s)
    return got


NOT_SPEAKABLE = {"lone surrogate": "\ud800 hi", "NUL": "hi\x00 there"}


@pytest.mark.parametrize("split", ["none", "sentence", "append"])
@pytest.mark.parametrize("text", list(NOT_SPEAKABLE.values()), ids=list(NOT_SPEAKABLE))
def test_text_that_cannot_be_encoded_is_refused_at_once_naming_text(text_shim, split, text):
    """A lone surrogate (valid JSON as an escape) used to fail the utterance inside the server and
    leave the client without a word until the idle timeout."""
    t0 = time.monotonic()
    got = asyncio.run(_exchange(ws_url(text_shim.url), [
        {"type": "session.config", **_config(split_granularity=split)},
        {"type": "input.text", "text": text}, {"type": "input.done"}], dones=1, timeout_s=20))
    errors = [g for g in got if isinstance(g, dict) and g["type"] == "error"]
    assert len(errors) == 1, got
    assert errors[0]["code"] == "invalid_request" and errors[0]["param"] == "text", errors
    assert errors[0]["message"].startswith("invalid_request: text: contains "), errors
    assert got[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 0}, got
    assert time.monotonic() - t0 < 2.0   # the shim's idle timeout is 3 s here


def test_a_second_session_config_changes_the_fields_it_names_for_the_next_utterance(text_shim):
    """Between utterances a session.config changes what it names (here the voice and the audio
    transport) for the utterances that follow; the rest of the config stays, and the utterance
    already under way keeps its own, its transport included."""
    url = ws_url(text_shim.url)
    first = {**_config(split_granularity="none", max_new_tokens=40), "voice": "ryan"}
    text = "The same words in two voices."

    def solo(config: dict) -> bytes:
        got = asyncio.run(_exchange(url, [{"type": "session.config", **config},
                                          {"type": "input.text", "text": text}, {"type": "input.done"}], dones=1))
        assert not [g for g in got if isinstance(g, dict) and g["type"] == "error"], got
        return b"".join(g for g in got if isinstance(g, bytes))

    ryan, eric = solo(first), solo({**first, "voice": "eric"})
    assert ryan and eric and ryan != eric
    got = asyncio.run(_exchange(url, [
        {"type": "session.config", **first}, {"type": "input.text", "text": text}, {"type": "input.done"},
        {"type": "session.config", "voice": "eric", "audio_transport": "json"},
        {"type": "input.text", "text": text}, {"type": "input.done"}], dones=2))
    assert not [g for g in got if isinstance(g, dict) and g["type"] == "error"], got
    binary = b"".join(g for g in got if isinstance(g, bytes))
    chunks = [g for g in got if isinstance(g, dict) and g["type"] == "audio.chunk"]
    assert {c["utterance_index"] for c in chunks} == {1}, {c["utterance_index"] for c in chunks}
    assert binary == ryan
    assert b"".join(base64.b64decode(c["audio_b64"]) for c in chunks) == eric
    assert all(c["format"] == "pcm" for c in chunks)   # kept from the first config


def test_a_message_nested_too_deeply_is_the_clients_error(text_shim):
    deep = '{"type": "session.config", "model": ' + "[" * 20000 + "]" * 20000 + "}"
    got = asyncio.run(_exchange(ws_url(text_shim.url), [deep], dones=1, timeout_s=20))
    assert len(got) == 1 and got[0]["type"] == "error", got
    assert got[0]["code"] == "invalid_request" and got[0]["status"] == 400, got
    assert "nested too deeply" in got[0]["message"], got
