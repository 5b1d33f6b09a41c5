"""`POST /v1/chat/completions` on Qwen3-Omni (tiny random weights: it writes and speaks nonsense)
behind a real tritonserver and the real speech API, through the official `openai` SDK: the text
and the audio equal what a direct Triton stream of the same request gives, text-only answers skip
the audio stages, history and earlier audio answers reach the thinker, bad fields are 400s naming
them, a hang-up frees the stream, and the page's chat box holds a conversation."""
from __future__ import annotations

import asyncio
import base64
import io
import json
import shutil
import time

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
import yaml

from client.triton_stream import stream_parts
from tests.system.speech_api_fixtures import served_stack
from tests.system.speech_api_helpers import ROOT, decode, metric, wait_for

pytestmark = pytest.mark.system
MODEL = "qwen3_omni_tiny_random"
LONG = "qwen3_omni"            # the family's pipeline, here on a checkpoint whose answers run long
LONG_ANSWER_TOKENS = 2000      # and the talker stops only at talker_max_new_tokens
QUANTUM = 2.0 / 32767          # s16 encoding (x 32767) decoded as x / 32768
USER = [{"role": "user", "content": "Hello! Who are you?"}]
GREEDY = {"temperature": 0, "seed": 5, "max_completion_tokens": 24}
GREEDY_PARAMS = {"do_sample": False, "seed": 5, "max_tokens": 24}   # what the route sends for GREEDY


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A tritonserver with the committed Qwen3-Omni tiny random models, a build of the same
    pipeline on a checkpoint whose answers run long (LONG), and hibari (a model that reads aloud),
    and a speech API in front."""
    from ensemble_builder.build import build
    from omni_backend.models.qwen3_omni.random_checkpoint import write_random_checkpoint

    base = tmp_path_factory.mktemp("omni_chat")
    repo = base / "model_repository"
    models = [MODEL, f"{MODEL}__thinker", f"{MODEL}__talker", f"{MODEL}__code2wav", "hibari", "hibari__synthesizer"]
    assert (ROOT / "model_repository" / MODEL).is_dir(), \
        f"{MODEL} is not in the committed model repository: rebuild it (make repository)"
    for model in models:
        shutil.copytree(ROOT / "model_repository" / model, repo / model, ignore=shutil.ignore_patterns("__pycache__"))
    # the committed checkpoint's answers end after 48 tokens and 64 frames (about 2 s of work):
    # too short to be sure a client still listens when it hangs up
    checkpoint = write_random_checkpoint(str(base / "long"), "tiny", seed=4, thinker_eos_after=LONG_ANSWER_TOKENS,
                                         talker_eos_after=None)
    deploy = yaml.safe_load((ROOT / "deploy" / f"{MODEL}.yaml").read_text())
    deploy.update(pipeline=LONG, model=checkpoint)
    (base / "long.yaml").write_text(yaml.safe_dump(deploy))
    build(LONG, repo, base / "long.yaml")
    with served_stack(repo, base) as stack:
        yield stack


@pytest.fixture(scope="module")
def client(stack):
    return openai.OpenAI(base_url=f"{stack[1].url}/v1", api_key="not-needed", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def voices(stack):
    body = httpx.get(f"{stack[1].url}/v1/audio/voices", params={"model": MODEL}).json()
    assert body["voices"] and body["default"] in body["voices"]
    return body["voices"]


def direct(server, text: str, params: dict) -> tuple[str, np.ndarray, list[str]]:
    """The same request streamed from Triton itself: its text, its audio, and the order of kinds."""
    text_out, audio, kinds = [], [], []
    for part in stream_parts(server.grpc_url, MODEL, text, params):
        if "TEXT_DELTA" in part.outputs:
            text_out.append(part.outputs["TEXT_DELTA"].reshape(-1)[0].decode())
            kinds.append("text")
        if part.audio is not None:
            assert part.sample_rate == 24000
            audio.append(part.audio)
            kinds.append("audio")
    return "".join(text_out), (np.concatenate(audio) if audio else np.zeros(0, np.float32)), kinds


def test_models_list_the_chat_model(stack):
    models = {m["id"]: m["chat"] for m in httpx.get(f"{stack[1].url}/v1/models").json()["data"]}
    assert models[MODEL] is True and models["hibari"] is False


def test_streamed_answer_equals_the_triton_stream(stack, client, voices):
    server, _ = stack
    voice = voices[-1]
    text, audio, kinds = direct(server, USER[0]["content"], {**GREEDY_PARAMS, "speaker": voice})
    assert text and audio.size and kinds[0] == "text"
    chunks = list(client.chat.completions.create(model=MODEL, messages=USER, modalities=["text", "audio"],
                                                 audio={"voice": voice.upper(), "format": "wav"}, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    deltas = [c.choices[0].delta.audio for c in chunks if c.choices and c.choices[0].delta.audio]
    assert "".join(d.transcript for d in deltas if d.transcript) == text
    wav = b"".join(base64.b64decode(d.data) for d in deltas if d.data)
    samples, rate = decode(wav, "wav")
    assert rate == 24000 and samples.size == audio.size
    np.testing.assert_allclose(samples, audio, atol=QUANTUM)
    # the random thinker never writes its end token: the answer stops at max_completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.completion_tokens_details.audio_tokens == pytest.approx(audio.size / 24000 * 12.5, abs=1)


def test_whole_answer_in_pcm16_equals_the_triton_stream(stack, client):
    server, _ = stack
    text, audio, _ = direct(server, USER[0]["content"], GREEDY_PARAMS)   # alloy: the model's default voice
    answer = client.chat.completions.create(model=MODEL, messages=USER, modalities=["text", "audio"],
                                            audio={"voice": "alloy", "format": "pcm16"}, **GREEDY)
    message = answer.choices[0].message
    assert message.content is None and message.audio.transcript == text
    assert answer.choices[0].finish_reason == "length"
    samples = np.frombuffer(base64.b64decode(message.audio.data), "<i2").astype(np.float32) / 32768
    assert samples.size == audio.size
    np.testing.assert_allclose(samples, audio, atol=QUANTUM)

    flac = client.chat.completions.create(model=MODEL, messages=USER, modalities=["text", "audio"],
                                          audio={"voice": "alloy", "format": "flac"}, **GREEDY)
    decoded, rate = sf.read(io.BytesIO(base64.b64decode(flac.choices[0].message.audio.data)), dtype="float32")
    assert rate == 24000 and decoded.size == audio.size


def test_text_only_answer_has_no_audio(stack, client):
    server, _ = stack
    text, audio, _ = direct(server, USER[0]["content"], {**GREEDY_PARAMS, "return_audio": False})
    assert audio.size == 0
    answer = client.chat.completions.create(model=MODEL, messages=USER, **GREEDY)
    assert answer.choices[0].message.content == text and answer.choices[0].message.audio is None
    chunks = list(client.chat.completions.create(model=MODEL, messages=USER, stream=True, **GREEDY))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert not any(c.choices[0].delta.audio for c in chunks)


def test_history_and_an_earlier_audio_answer_reach_the_thinker(stack, client):
    server, _ = stack
    first = client.chat.completions.create(model=MODEL, messages=USER, modalities=["text", "audio"],
                                           audio={"voice": "alloy", "format": "pcm16"}, **GREEDY)
    said = first.choices[0].message.audio
    follow_up = {"role": "user", "content": "Say that again."}
    system = {"role": "system", "content": "You are terse."}
    text, _, _ = direct(server, follow_up["content"], {**GREEDY_PARAMS, "return_audio": False, "system": system["content"],
                                                       "messages": [USER[0], {"role": "assistant", "content": said.transcript}]})
    by_id = client.chat.completions.create(model=MODEL, **GREEDY, messages=[
        system, *USER, {"role": "assistant", "audio": {"id": said.id}}, follow_up])
    by_text = client.chat.completions.create(model=MODEL, **GREEDY, messages=[
        system, *USER, {"role": "assistant", "content": said.transcript}, follow_up])
    assert by_id.choices[0].message.content == by_text.choices[0].message.content == text
    alone = client.chat.completions.create(model=MODEL, messages=[follow_up], **GREEDY)
    assert alone.choices[0].message.content != text


def test_system_messages_between_turns_reach_the_thinker_in_place(stack, client):
    """System and developer messages anywhere (OpenAI's clients send several): each is rendered
    where it stands; the answer equals Triton's for the same conversation, and differs from the
    one without the late system message (it was a 400)."""
    server, _ = stack
    said = {"role": "assistant", "content": "Hello to you too."}
    late = {"role": "system", "content": "From now on, answer in French."}
    follow_up = {"role": "user", "content": "Say that again."}
    text, _, _ = direct(server, follow_up["content"], {**GREEDY_PARAMS, "return_audio": False, "messages": [
        {"role": "system", "content": "You are terse."}, {"role": "system", "content": "Be kind."}, USER[0], said, late]})
    answer = client.chat.completions.create(model=MODEL, **GREEDY, messages=[
        {"role": "system", "content": "You are terse."}, {"role": "developer", "content": "Be kind."}, *USER, said,
        late, follow_up])
    assert answer.choices[0].message.content == text
    without = client.chat.completions.create(model=MODEL, **GREEDY, messages=[
        {"role": "system", "content": "You are terse."}, {"role": "developer", "content": "Be kind."}, *USER, said,
        follow_up])
    assert without.choices[0].message.content != text


@pytest.mark.parametrize("extra, param", [
    ({"modalities": ["text", "audio"], "audio": {"voice": "nobody", "format": "wav"}}, "audio.voice"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "ogg"}}, "audio.format"),
    ({"top_p": 0}, "top_p"),
    ({"n": 2}, "n"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"extra_body": {"talker_top_k": 5}}, "talker_top_k"),   # text only: the pipeline refuses audio settings
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
     "messages[0].content[0].input_audio.data"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "bm90IGF1ZGlv"}}]}]},
     "messages[0].content[0].input_audio.data"),
    ({"messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "x"}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}}]}]},
     "messages[0].content[0].image_url.url"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content[0].image_url.url"),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [
        {"type": "input_audio", "input_audio": {"data": "AAAA"}}]}, *USER]}, "messages[1].content[0].type"),
    ({"max_tokens": 0}, "max_tokens"),
    # stop sequences end text answers only; their number and length are the model's to check
    ({"stop": "END", "modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "wav"}}, "stop"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"stop": ["a", ""]}, "stop[1]"),
])
def test_bad_fields_are_400s_naming_them(client, extra, param):
    body = {"model": MODEL, "messages": USER, **extra}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**body)
    assert e.value.param == param, e.value


def _wav_b64(seconds: float, rate: int = 16000) -> str:
    t = np.arange(int(seconds * rate)) / rate
    handle = io.BytesIO()
    sf.write(handle, (0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return base64.b64encode(handle.getvalue()).decode()


def test_a_spoken_question_equals_the_triton_stream(stack, client):
    """OpenAI's input_audio part reaches the thinker's audio tower: the answer (text and speech)
    equals Triton's own stream of the same message, and another recording changes it."""
    server, _ = stack
    recording = {"type": "input_audio", "input_audio": {"data": _wav_b64(2.0, 44100), "format": "wav"}}
    question = [recording, {"type": "text", "text": "What is said in this recording?"}]
    text, audio, _ = direct(server, "", {**GREEDY_PARAMS, "content": question})
    assert text and audio.size
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                            modalities=["text", "audio"], audio={"voice": "alloy", "format": "pcm16"},
                                            **GREEDY)
    said = answer.choices[0].message.audio
    assert said.transcript == text
    samples = np.frombuffer(base64.b64decode(said.data), "<i2").astype(np.float32) / 32768
    np.testing.assert_allclose(samples, audio, atol=QUANTUM)
    # the recording alone (no text), then in an earlier turn of the conversation
    alone = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [recording]}],
                                           **GREEDY)
    assert alone.choices[0].message.content == direct(server, "", {**GREEDY_PARAMS, "return_audio": False,
                                                                   "content": [recording]})[0]
    other = {"type": "input_audio", "input_audio": {"data": _wav_b64(1.0), "format": "wav"}}
    changed = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [other, question[1]]}],
                                             **GREEDY)
    assert changed.choices[0].message.content != text
    later = client.chat.completions.create(model=MODEL, **GREEDY, messages=[
        {"role": "user", "content": question}, {"role": "assistant", "content": text},
        {"role": "user", "content": "Say it again."}])
    assert later.choices[0].message.content == direct(server, "Say it again.", {
        **GREEDY_PARAMS, "return_audio": False,
        "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": text}]})[0]


def test_vllm_omni_client_body_is_answered(stack, client):
    """What vLLM-Omni's Qwen3-Omni clients post: the recording as an `audio_url` data URL and
    `modalities: ["audio"]`; the answer equals the OpenAI-shaped request's (input_audio, text and
    audio), and a recording the server cannot read names the `audio_url` part."""
    data = _wav_b64(2.0, 44100)
    question = "What is said in this recording?"
    openai_shaped = client.chat.completions.create(
        model=MODEL, modalities=["text", "audio"], audio={"voice": "alloy", "format": "pcm16"}, **GREEDY,
        messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": data, "format": "wav"}},
                                               {"type": "text", "text": question}]}])
    url = f"data:audio/wav;base64,{data}"
    peer = client.chat.completions.create(
        model=MODEL, modalities=["audio"], audio={"voice": "alloy", "format": "pcm16"}, **GREEDY,
        messages=[{"role": "user", "content": [{"type": "audio_url", "audio_url": {"url": url}},
                                               {"type": "text", "text": question}]}])
    assert peer.choices[0].message.content is None
    assert peer.choices[0].message.audio.transcript == openai_shaped.choices[0].message.audio.transcript
    assert peer.choices[0].message.audio.data == openai_shaped.choices[0].message.audio.data
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, **GREEDY, messages=[{"role": "user", "content": [
            {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64,bm90IGF1ZGlv"}}]}])
    assert e.value.param == "messages[0].content[0].audio_url.url", e.value


def test_vllm_omni_chat_shapes_audio_without_an_audio_object_modality_and_ignore_eos(stack, client, voices):
    """What vLLM-Omni's chat clients and benchmark send and read: audio asked for with no `audio`
    object (the voice its `speaker`, the audio wav), chunks marked with a top-level `modality`,
    and `ignore_eos`, which runs the thinker past its end of turn up to max_tokens."""
    server, _ = stack
    voice = voices[-1]
    text, audio, _ = direct(server, USER[0]["content"], {**GREEDY_PARAMS, "speaker": voice})
    chunks = list(client.chat.completions.create(model=MODEL, messages=USER, modalities=["audio"], stream=True,
                                                 extra_body={"speaker": voice}, **GREEDY))
    data = [c for c in chunks if c.choices and c.choices[0].delta.audio and c.choices[0].delta.audio.data]
    assert data and all(c.model_extra["modality"] == "audio" for c in data)
    samples, rate = decode(b"".join(base64.b64decode(c.choices[0].delta.audio.data) for c in data), "wav")
    assert rate == 24000 and samples.size == audio.size
    np.testing.assert_allclose(samples, audio, atol=QUANTUM)
    assert "".join(c.choices[0].delta.audio.transcript or "" for c in chunks
                   if c.choices and c.choices[0].delta.audio) == text

    texts = list(client.chat.completions.create(model=MODEL, messages=USER, stream=True, **GREEDY))
    content = [c for c in texts if c.choices and c.choices[0].delta.content]
    assert content and all(c.model_extra["modality"] == "text" for c in content)
    assert all("modality" not in c.model_extra for c in texts if c not in content)

    # the committed checkpoint's thinker ends its turn after 48 tokens
    ask = {"model": MODEL, "messages": USER, "temperature": 0, "seed": 5, "max_completion_tokens": 60}
    ended = client.chat.completions.create(**ask)
    assert ended.choices[0].finish_reason == "stop" and ended.usage.completion_tokens < 60
    forced = client.chat.completions.create(**ask, extra_body={"ignore_eos": True})
    assert forced.choices[0].finish_reason == "length"
    assert forced.usage.completion_tokens > ended.usage.completion_tokens
    assert forced.choices[0].message.content.startswith(ended.choices[0].message.content)


def test_vllm_omni_example_client_request_equals_the_triton_stream(stack, client):
    """vLLM-Omni's example Qwen3-Omni client: a system prompt, the recording as an audio_url, and
    extra_body `sampling_params_list` (thinker, talker, code2wav; seeded sampling): the answer
    equals Triton's stream of the same request with the thinker's and talker's fields by name."""
    server, _ = stack
    system = "You are Qwen, a virtual human capable of perceiving auditory and visual inputs."
    data = _wav_b64(1.5)
    from tests.vllm_omni_requests import CODE2WAV, TALKER, THINKER

    thinker, talker = {**THINKER, "max_tokens": 24}, {**TALKER, "max_tokens": 40}   # short answers
    question = [{"type": "audio_url", "audio_url": {"url": f"data:audio/wav;base64,{data}"}},
                {"type": "text", "text": "What is the content of this audio?"}]
    answer = client.chat.completions.create(
        model=MODEL, modalities=["audio"], audio={"voice": "alloy", "format": "pcm16"},
        messages=[{"role": "system", "content": [{"type": "text", "text": system}]},
                  {"role": "user", "content": question}],
        extra_body={"sampling_params_list": [thinker, talker, CODE2WAV]})
    text, audio, _ = direct(server, "", {
        "system": system, "content": [{"type": "input_audio", "input_audio": {"data": f"data:audio/wav;base64,{data}"}},
                                      question[1]],
        "do_sample": True, "temperature": 0.4, "top_p": 0.9, "top_k": 1, "max_tokens": 24,
        "repetition_penalty": 1.05, "seed": 42, "talker_do_sample": True, "talker_temperature": 0.9,
        "talker_top_k": 50, "talker_max_new_tokens": 40, "talker_repetition_penalty": 1.05})
    said = answer.choices[0].message.audio
    assert text and audio.size and said.transcript == text
    np.testing.assert_allclose(np.frombuffer(base64.b64decode(said.data), "<i2").astype(np.float32) / 32768, audio,
                               atol=QUANTUM)


def test_vllm_omni_realtime_session_answers_a_spoken_turn(stack, client):
    """vLLM-Omni's `/v1/realtime` client: session.update with the model, a non-final commit, the
    recording as PCM16 16-kHz chunks, a final commit; the answer's text (transcription.*) equals the
    chat route's answer to the same recording, its audio comes as PCM16 deltas at 24 kHz; a second
    turn on the same connection is answered too, and bad messages are coded errors that leave the
    session open."""
    from websockets.asyncio.client import connect

    wav = base64.b64decode(_wav_b64(1.5))
    pcm = sf.read(io.BytesIO(wav), dtype="int16")[0].tobytes()
    url = stack[1].url.replace("http://", "ws://") + "/v1/realtime"
    want = client.chat.completions.create(model=MODEL, modalities=["text"], messages=[{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}]}])

    async def turn(ws) -> tuple[str, bytes, list[dict]]:
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": False}))
        for i in range(0, len(pcm), 6400):
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(pcm[i:i + 6400]).decode()}))
        await ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
        deltas, audio, events = [], b"", []
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), 120))
            events.append(event)
            if event["type"] == "transcription.delta":
                deltas.append(event["delta"])
            elif event["type"] == "response.audio.delta":
                assert event["sample_rate_hz"] == 24000
                audio += base64.b64decode(event["audio"])
            elif event["type"] in ("response.audio.done", "error"):
                return "".join(deltas), audio, events

    async def session():
        async with connect(url, max_size=None) as ws:
            created = json.loads(await ws.recv())
            assert created["type"] == "session.created" and created["id"] == created["session"]["id"]
            await ws.send(json.dumps({"type": "session.update", "model": "hibari"}))
            refused = json.loads(await ws.recv())
            await ws.send(json.dumps({"type": "session.update", "session": {"model": MODEL, "turn_detection": None,
                                                                           "input_audio_format": "pcm16",
                                                                           "tools": []}}))
            updated = json.loads(await ws.recv())
            assert updated["type"] == "session.updated" and updated["ignored_fields"] == ["tools"]
            # an older vLLM-Omni client commits once before its audio, without `final`: acknowledged
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            early = json.loads(await ws.recv())
            assert early["type"] == "input_audio_buffer.committed" and early["final"] is False
            await ws.send(json.dumps({"type": "session.update", "turn_detection": {"type": "server_vad"}}))
            assert json.loads(await ws.recv())["param"] == "turn_detection"
            await ws.send(json.dumps({"type": "session.update", "input_audio_format": "g711_ulaw"}))
            assert json.loads(await ws.recv())["param"] == "input_audio_format"
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": "not base64!"}))
            bad_audio = json.loads(await ws.recv())
            first = await turn(ws)
            second = await turn(ws)
            return refused, bad_audio, first, second

    refused, bad_audio, first, second = asyncio.run(session())
    assert refused["type"] == "error" and refused["param"] == "model"
    assert bad_audio["type"] == "error" and bad_audio["param"] == "audio"
    for text, audio, events in (first, second):
        assert text == want.choices[0].message.content, [e for e in events if e["type"] == "error"]
        done = next(e for e in events if e["type"] == "transcription.done")
        assert done["text"] == text and len(audio) > 0 and len(audio) % 2 == 0


def _pcm24(seconds: float) -> bytes:
    t = np.arange(int(seconds * 24000)) / 24000
    return (0.3 * np.sin(2 * np.pi * 330 * t) * 32767).astype("<i2").tobytes()


def test_openai_realtime_sdk_holds_a_spoken_conversation(stack, client):
    """The official `openai` SDK's Realtime client (GA events; the URL names the model): a committed
    recording (PCM16, 24 kHz) answered on response.create, its transcript and audio as the chat
    route answers the same conversation; a typed follow-up answered in text with the whole
    conversation as history; the SDK parses every event."""
    pcm = _pcm24(1.5)
    wav = io.BytesIO()
    sf.write(wav, np.frombuffer(pcm, "<i2"), 24000, format="WAV", subtype="PCM_16")
    recording = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav.getvalue()).decode(),
                                                        "format": "wav"}}
    system = {"role": "system", "content": "Be brief."}
    spoken = client.chat.completions.create(model=MODEL, messages=[system, {"role": "user", "content": [recording]}],
                                            modalities=["text", "audio"], audio={"voice": "ethan", "format": "pcm16"})
    said = spoken.choices[0].message.audio
    follow_up = client.chat.completions.create(model=MODEL, modalities=["text"], messages=[
        system, {"role": "user", "content": [recording]}, {"role": "assistant", "content": said.transcript},
        {"role": "user", "content": "And again?"}])

    async def talk():
        rt = openai.AsyncOpenAI(base_url=f"{stack[1].url}/v1", api_key="not-needed", max_retries=0)
        async with rt.realtime.connect(model=MODEL) as conn:
            await conn.session.update(session={
                "type": "realtime", "output_modalities": ["audio"], "instructions": "Be brief.",
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None},
                          "output": {"voice": "ethan"}}})
            await conn.input_audio_buffer.append(audio=base64.b64encode(pcm).decode())
            await conn.input_audio_buffer.commit()
            await conn.response.create()
            first = [event async for event in _until_done(conn)]
            await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                      "content": [{"type": "input_text", "text": "And again?"}]})
            await conn.response.create(response={"output_modalities": ["text"]})
            second = [event async for event in _until_done(conn)]
            return first, second

    first, second = asyncio.run(talk())
    kinds = [e.type for e in first]
    assert kinds[:6] == ["session.created", "session.updated", "input_audio_buffer.committed",
                         "conversation.item.added", "conversation.item.done", "response.created"], kinds
    transcript = "".join(e.delta for e in first if e.type == "response.output_audio_transcript.delta")
    audio = b"".join(base64.b64decode(e.delta) for e in first if e.type == "response.output_audio.delta")
    done = first[-1]
    assert done.type == "response.done" and done.response.status == "completed"
    # the talker samples (no seed in the Realtime API): the same words, audio of its own
    assert transcript == said.transcript, (transcript[:80], said.transcript[:80])
    assert len(audio) > 0 and len(audio) % 2 == 0
    assert done.response.output[0].content[0].transcript == transcript and done.response.usage.total_tokens > 0
    text = "".join(e.delta for e in second if e.type == "response.output_text.delta")
    assert second[-1].response.status == "completed" and text == follow_up.choices[0].message.content
    assert not any(e.type.startswith("response.output_audio") for e in second)


async def _until_done(conn):
    async for event in conn:
        yield event
        if event.type in ("response.done", "error"):
            return


def test_openai_realtime_beta_names_cancel_and_errors(stack):
    """The SDK's beta client (`OpenAI-Beta: realtime=v1`): the beta's event names; response.cancel
    ends the answer with status cancelled; a server VAD, an empty commit, a cancel with nothing to
    cancel and a second response while one runs are errors that name them, and the session goes
    on."""
    async def talk():
        url = stack[1].url
        rt = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="not-needed", max_retries=0,
                             websocket_base_url=url.replace("http://", "ws://") + "/v1")
        async with rt.beta.realtime.connect(model=MODEL) as conn:
            await conn.session.update(session={"turn_detection": {"type": "server_vad"}})
            await conn.input_audio_buffer.commit()
            await conn.response.cancel()
            await conn.session.update(session={"modalities": ["text", "audio"], "voice": "chelsie",
                                               "turn_detection": None})
            await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
                {"type": "input_audio", "audio": base64.b64encode(_pcm24(1.0)).decode()}]})
            await conn.response.create()
            await conn.response.create()
            events = []
            async for event in conn:
                events.append(event)
                if event.type == "response.audio_transcript.delta" and len(events) < 40:
                    await conn.response.cancel()
                if event.type == "response.done":
                    return events

    events = asyncio.run(talk())
    errors = [e.error for e in events if e.type == "error"]
    assert [e.param for e in errors[:2]] == ["turn_detection", "input_audio_buffer"]
    assert errors[1].code == "input_audio_buffer_commit_empty" and errors[2].code == "response_cancel_not_active"
    assert any(e.code == "conversation_already_has_active_response" for e in errors[2:])
    kinds = [e.type for e in events]
    assert "conversation.item.created" in kinds and "response.audio_transcript.delta" in kinds
    assert not any(k.startswith(("response.output_audio", "response.output_text")) for k in kinds)
    assert events[-1].response.status == "cancelled"


def test_a_recording_over_the_limit_is_a_400_saying_it(client):
    too_long = {"type": "input_audio", "input_audio": {"data": _wav_b64(121.0, 8000), "format": "wav"}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [too_long]}], **GREEDY)
    assert e.value.param == "messages[0].content[0].input_audio.data"
    assert "at most 120 s" in str(e.value)


def _png_b64(width: int, height: int) -> str:
    from PIL import Image

    rng = np.random.default_rng(width * height)
    handle = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(handle, format="PNG")
    return base64.b64encode(handle.getvalue()).decode()


@pytest.fixture(scope="module")
def image_site():
    """A local web server with one image, for the speech API to fetch."""
    import http.server
    import threading

    body = base64.b64decode(_png_b64(96, 64))

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/photo.png" else 404)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/photo.png", base64.b64encode(body).decode()
    server.shutdown()


@pytest.fixture(scope="module")
def fetching_client(stack, tmp_path_factory):
    from client.speech_api.process import ShimProcess

    shim = ShimProcess([stack[0].grpc_url], extra_args=["--fetch-allow-host", "127.0.0.1", "--fetch-allow-private"],
                       log_path=tmp_path_factory.mktemp("fetching_shim") / "shim.log")
    shim.start()
    try:
        yield openai.OpenAI(base_url=f"{shim.url}/v1", api_key="not-needed", max_retries=0, timeout=120)
    finally:
        shim.stop()


def test_an_image_question_equals_the_triton_stream(stack, client, fetching_client, image_site):
    """image_url parts as data URLs reach the vision encoder; an http(s) URL is fetched only by a
    server whose operator allowed its host, and answers as the same image sent inline."""
    server, _ = stack
    url, data = image_site
    inline = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}},
              {"type": "text", "text": "What is in this picture?"}]
    text, audio, _ = direct(server, "", {**GREEDY_PARAMS, "content": inline})
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": inline}],
                                            modalities=["text", "audio"], audio={"voice": "alloy", "format": "pcm16"},
                                            **GREEDY)
    said = answer.choices[0].message.audio
    assert said.transcript == text
    np.testing.assert_allclose(np.frombuffer(base64.b64decode(said.data), "<i2").astype(np.float32) / 32768, audio,
                               atol=QUANTUM)
    linked = [{"type": "image_url", "image_url": {"url": url}}, inline[1]]
    fetched = fetching_client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": linked}],
                                                      **GREEDY)
    assert fetched.choices[0].message.content == text
    with pytest.raises(openai.BadRequestError) as e:   # the default server fetches nothing
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": linked}], **GREEDY)
    assert e.value.param == "messages[0].content[0].image_url.url" and "fetches no URL" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        fetching_client.chat.completions.create(model=MODEL, **GREEDY, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url.replace("photo", "gone")}}]}])
    assert e.value.param == "messages[0].content[0].image_url.url" and "HTTP 404" in str(e.value)
    other = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{_png_b64(200, 120)}"}}, inline[1]]
    assert client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": other}],
                                          **GREEDY).choices[0].message.content != text


def test_routes_keep_chat_and_speech_apart(stack, client):
    shim = stack[1]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="hibari", messages=USER)
    assert e.value.param == "model" and "/v1/audio/speech" in str(e.value)
    r = httpx.post(f"{shim.url}/v1/audio/speech", json={"model": MODEL, "input": "Hi.", "voice": "alloy"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert "/v1/chat/completions" in r.json()["error"]["message"]

    async def session_config() -> dict:
        from websockets.asyncio.client import connect

        from client.speech_stream_client import ws_url

        async with connect(ws_url(shim.url)) as ws:
            await ws.send(json.dumps({"type": "session.config", "model": MODEL, "voice": "alloy"}))
            return json.loads(await ws.recv())

    error = asyncio.run(session_config())
    assert error["type"] == "error" and error["param"] == "model", error


def hang_up(server, shim, request_id: str, until: str) -> None:
    """Stream an answer of LONG (minutes of work), leave once a delta carrying `until` arrived,
    and check that the stream and both AR stages are freed at once."""
    body = {"model": LONG, "messages": USER, "stream": True, "max_tokens": 4000, "temperature": 1, "seed": 1,
            "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"},
            "talker_max_new_tokens": 4000}
    # the earlier tests' streams are over (their end is counted a moment after their last byte)
    assert wait_for(lambda: metric(server, "omni_active_streams", pipeline=LONG) == 0, 5.0)
    with httpx.Client(timeout=60, headers={"x-request-id": request_id}) as http:
        with http.stream("POST", f"{shim.url}/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            lines = r.iter_lines()   # kept: a closed line iterator closes the connection
            for line in lines:
                event = json.loads(line[len("data: "):]) if line.startswith("data: {") else {}
                if until in ((event.get("choices") or [{}])[0].get("delta") or {}).get("audio", {}):
                    break
            assert wait_for(lambda: metric(server, "omni_active_streams", pipeline=LONG) == 1, 2.0)
            # leaving the block closes the connection with the answer still being written
    assert wait_for(lambda: metric(server, "omni_active_streams", pipeline=LONG) == 0, 5.0)
    line = wait_for(lambda: [ln for ln in shim.log_text().splitlines() if request_id in ln], 5)
    assert line and "outcome=cancelled" in line[-1], shim.log_tail()
    for stage in ("thinker", "talker"):
        assert wait_for(lambda: metric(server, "omni_stage_active_requests", model=f"{LONG}__{stage}") == 0, 5.0), stage


def test_hang_up_mid_audio_frees_the_stream(stack):
    hang_up(*stack, "omni-chat-hang-up-audio", until="data")


def test_hang_up_before_the_audio_frees_the_stream(stack):
    """Also while the talker still waits for its first text (its request not yet answered)."""
    hang_up(*stack, "omni-chat-hang-up-text", until="transcript")


def _open_chat(browser, url: str) -> None:
    """The page, with the chat model chosen and its chat box shown."""
    browser.navigate(f"{url}/")
    browser.wait_for("window.omniSpeech && window.omniSpeech.ready", 15)
    browser.evaluate(f"(() => {{ const m = document.getElementById('model'); m.value = {json.dumps(MODEL)};"
                     " m.dispatchEvent(new Event('change')); })()")
    browser.wait_for("window.omniSpeech.mode === 'chat' && document.getElementById('voice').value", 5)


def test_page_chat_box_holds_a_conversation(stack, tmp_path):
    """Two turns in the page's chat box (headless Chromium): the second is sent with the first
    as its history, and both answers stream as text and play as audio."""
    import os

    from tests.system.chromium_cdp import CHROMIUM, Chromium

    assert os.path.exists(CHROMIUM), "the page test needs Debian's chromium (apt-get install -y chromium)"
    browser = Chromium().start()
    try:
        _open_chat(browser, stack[1].url)
        for n, said in enumerate(("Hello there.", "And then?"), 1):
            browser.evaluate(f"document.getElementById('chat-input').value = {json.dumps(said)}")
            browser.click("#chat-send")
            browser.wait_for(f"window.omniSpeech.chat.history.length === {2 * n} || "
                             "window.omniSpeech.chat.phase === 'error'", 60)
            state = json.loads(browser.evaluate("JSON.stringify(window.omniSpeech.chat)"))
            assert state["phase"] == "done", state["error"]
            assert state["answer"] and state["audioSeconds"] > 0.1
        browser.screenshot(tmp_path / "chat.png")
        assert [t["role"] for t in state["history"]] == ["user", "assistant"] * 2
        turns = browser.evaluate("[...document.querySelectorAll('#chat-log .turn')].map(t => t.textContent)")
        assert turns == [t["content"] for t in state["history"]]
    finally:
        browser.stop()


def test_page_chat_box_sends_a_recording_and_an_image(stack, tmp_path):
    """The page records from the microphone (Chromium's test tone) and attaches an image file: the
    message goes as input_audio (WAV) and image_url (data URL) parts before the text, and the
    answer streams as text and audio."""
    import os

    from PIL import Image

    from tests.system.chromium_cdp import CHROMIUM, Chromium

    assert os.path.exists(CHROMIUM), "the page test needs Debian's chromium (apt-get install -y chromium)"
    picture = tmp_path / "picture.png"
    Image.new("RGB", (80, 48), (200, 40, 40)).save(picture)
    browser = Chromium().start()
    try:
        _open_chat(browser, stack[1].url)
        browser.click("#chat-record")
        browser.wait_for("document.getElementById('chat-record').classList.contains('recording')", 10)
        time.sleep(1.2)
        browser.click("#chat-record")
        browser.wait_for("window.omniSpeech.chat.attachments.length === 1", 10)
        root = browser.call("DOM.getDocument", session=True)["root"]["nodeId"]
        node = browser.call("DOM.querySelector", session=True, nodeId=root, selector="#chat-image")["nodeId"]
        browser.call("DOM.setFileInputFiles", session=True, nodeId=node, files=[str(picture)])
        browser.wait_for("window.omniSpeech.chat.attachments.length === 2", 10)
        browser.evaluate("document.getElementById('chat-input').value = 'What do you hear and see?'")
        browser.click("#chat-send")
        browser.wait_for("window.omniSpeech.chat.history.length === 2 || window.omniSpeech.chat.phase === 'error'", 90)
        state = json.loads(browser.evaluate("JSON.stringify(window.omniSpeech.chat)"))
        assert state["phase"] == "done", state["error"]
        assert state["answer"] and state["audioSeconds"] > 0.1
        kinds = [part["type"] for part in state["history"][0]["content"]]
        assert kinds == ["input_audio", "image_url", "text"]
        recording = base64.b64decode(state["history"][0]["content"][0]["input_audio"]["data"])
        samples, rate = sf.read(io.BytesIO(recording), dtype="float32")
        assert samples.size / rate > 0.5 and float(np.abs(samples).max()) > 0.01   # the tone was heard
        assert state["history"][0]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
        turns = browser.evaluate("[...document.querySelectorAll('#chat-log .turn')].map(t => t.textContent)")
        assert turns[0].startswith("[recording ") and "[image picture.png]" in turns[0]
        browser.screenshot(tmp_path / "chat_media.png")
    finally:
        browser.stop()
