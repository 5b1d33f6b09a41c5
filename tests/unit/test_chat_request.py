"""`POST /v1/chat/completions` bodies: what each OpenAI field becomes for a chat pipeline's entry
model (TEXT and PARAMS), and the 400s naming the field (client/speech_api/chat_request.py)."""
from __future__ import annotations

import json
import struct

import pytest

from client.speech_api.catalog import describe_pipeline
from client.speech_api.chat_completion import sized_wav
from client.speech_api.chat_request import (AudioTranscripts, ChatTritonRequest, build_chat_params, chat_error,
                                            parse_chat_body, refuse_chat_pipeline)
from client.speech_api.encoders.wav import WavEncoder
from client.speech_api.errors import ApiError, from_triton

# A catalog shaped like a chat pipeline's adapter describe() (the chat entry-model contract).
CATALOG = json.dumps({
    "chat": True, "description": "a chat pipeline", "sample_rate": 24000, "voices": ["ethan", "chelsie"],
    "params": [
        {"name": "messages", "type": "list"},
        {"name": "system", "type": "str"},
        {"name": "speaker", "type": "str", "default": "ethan"},
        {"name": "return_audio", "type": "bool", "default": True},
        {"name": "max_tokens", "type": "int", "lo": 1, "hi": 4096, "default": 512},
        {"name": "do_sample", "type": "bool", "default": True},
        {"name": "temperature", "type": "float", "lo": 0.01, "hi": 2.0, "default": 0.7},
        {"name": "top_p", "type": "float", "lo": 0.0, "hi": 1.0},
        {"name": "top_k", "type": "int", "lo": 0, "hi": 1000},
        {"name": "seed", "type": "int", "lo": 0, "hi": 2**63 - 1},
        {"name": "talker_temperature", "type": "float", "lo": 0.01, "hi": 2.0},
    ]})
INFO = describe_pipeline("chatty", CATALOG)
USER = {"role": "user", "content": "Hi there."}


def build(**body):
    req = parse_chat_body({"model": "chatty", "messages": [USER], **body})
    return req, build_chat_params(req, INFO)


def error_of(call, *args, **kwargs) -> ApiError:
    with pytest.raises(ApiError) as e:
        call(*args, **kwargs)
    assert e.value.status == 400
    return e.value


def test_catalog_marks_chat_pipelines_and_keeps_structured_params():
    assert INFO.chat and INFO.known and INFO.voices == ["ethan", "chelsie"]
    assert INFO.accepts("messages") and INFO.voice_field.name == "speaker"
    assert not describe_pipeline("tts", json.dumps({"params": []})).chat
    with pytest.raises(ApiError) as e:
        refuse_chat_pipeline(INFO)
    assert e.value.param == "model" and "/v1/chat/completions" in e.value.message


def test_text_only_request():
    req, triton = build()
    assert triton.text == "Hi there." and triton.params == {"return_audio": False}
    assert not req.audio and not req.stream


def test_audio_request_maps_voice_sampling_and_history():
    messages = [{"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "One"}, {"type": "text", "text": " two"}]},
                {"role": "assistant", "content": "Three."},
                {"role": "user", "content": [{"type": "text", "text": "Four?"}]}]
    req = parse_chat_body({"model": "chatty", "messages": messages, "modalities": ["text", "audio"],
                           "audio": {"voice": "Chelsie", "format": "pcm16"}, "max_completion_tokens": 64,
                           "temperature": 0.5, "top_p": 0.9, "seed": 7, "top_k": 20, "talker_temperature": 0.8,
                           "stream": True, "stream_options": {"include_usage": True}, "n": 1, "user": "u1"})
    triton = build_chat_params(req, INFO)
    assert triton.text == "Four?" and req.encoder_format == "pcm" and req.include_usage
    assert triton.params == {
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "One"}, {"type": "text", "text": " two"}]},
                     {"role": "assistant", "content": "Three."}],
        "speaker": "chelsie", "max_tokens": 64, "do_sample": True, "temperature": 0.5, "top_p": 0.9, "seed": 7,
        "top_k": 20, "talker_temperature": 0.8}
    assert "One two" in req.prompt_text() and triton.messages_offset == 1


def test_vllm_omni_clients_audio_only_modalities_and_audio_url_parts():
    """vLLM-Omni's clients ask for `modalities: ["audio"]` (answered as text and audio: OpenAI's
    answer with audio carries its text as the transcript) and send recordings as `audio_url`
    parts, which the media step turns into the `input_audio` parts the pipelines take."""
    import asyncio

    from client.speech_api.errors import from_triton
    from client.speech_api.media_fetch import FetchPolicy, fetch_message_media

    url = "data:audio/wav;base64,UklGRg=="
    body = {"model": "chatty", "modalities": ["audio"], "audio": {"voice": "ethan", "format": "wav"},
            "messages": [{"role": "user", "content": [{"type": "audio_url", "audio_url": {"url": url}}]},
                         {"role": "assistant", "content": "Heard."},
                         {"role": "user", "content": [{"type": "audio_url", "audio_url": url},
                                                      {"type": "text", "text": "And this?"}]}]}
    req = parse_chat_body(body)
    assert req.audio and req.voice == "ethan"
    req.audio_url_parts = asyncio.run(fetch_message_media(
        [(i, m["content"]) for i, m in enumerate(req.history)] + [(len(req.history), req.parts)], FetchPolicy()))
    assert req.audio_url_parts == ("messages[0].content[0]", "messages[2].content[0]")
    catalog = json.loads(CATALOG)
    catalog["params"].append({"name": "content", "type": "list"})   # the new message's media parts
    triton = build_chat_params(req, describe_pipeline("chatty", json.dumps(catalog)))
    assert triton.params["messages"][0]["content"] == [{"type": "input_audio", "input_audio": {"data": url}}]
    assert triton.params["content"] == [{"type": "input_audio", "input_audio": {"data": url}},
                                        {"type": "text", "text": "And this?"}]
    assert "return_audio" not in triton.params and triton.params["speaker"] == "ethan"
    # the entry's complaint about the recording names the part as the client sent it
    bad = chat_error(from_triton("invalid_request: content[0].input_audio.data: too short"), triton)
    assert bad.param == "messages[2].content[0].audio_url.url"
    assert bad.message.startswith("messages[2].content[0].audio_url.url: too short")
    earlier = chat_error(from_triton("invalid_request: messages[0].content[0].input_audio.data: bad"), triton)
    assert earlier.param == "messages[0].content[0].audio_url.url"


def test_vllm_omni_clients_ask_for_audio_without_an_audio_object():
    """vLLM-Omni's clients and README snippets send `modalities` with audio and no `audio`: the
    voice is their `speaker` (else the model's default) and the audio wav; `ignore_eos` (its
    benchmark's random dataset sends it) goes to a model that takes it."""
    req, triton = build(modalities=["audio"])
    assert (req.voice, req.audio_format) == ("", "wav") and "speaker" not in triton.params
    req, triton = build(modalities=["text", "audio"], speaker="Chelsie")
    assert (req.voice, req.audio_format) == ("Chelsie", "wav") and triton.params["speaker"] == "chelsie"
    _, triton = build(modalities=["text", "audio"], speaker="ethan", audio={"voice": "Ethan", "format": "mp3"})
    assert triton.params["speaker"] == "ethan"
    catalog = json.loads(CATALOG)
    catalog["params"].append({"name": "ignore_eos", "type": "bool"})
    req = parse_chat_body({"model": "chatty", "messages": [USER], "ignore_eos": True, "max_tokens": 9})
    assert build_chat_params(req, describe_pipeline("chatty", json.dumps(catalog))).params["ignore_eos"] is True
    assert error_of(build, ignore_eos=True).param == "ignore_eos"    # a model without it


def test_temperature_zero_is_greedy_and_stock_voices_mean_the_default():
    _, triton = build(temperature=0, modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"})
    assert triton.params == {"do_sample": False}
    assert error_of(build, temperature=0, do_sample=True).param == "do_sample"


@pytest.mark.parametrize("body, param", [
    ({"n": 3}, "n"), ({"tools": [{"type": "function"}]}, "tools"), ({"tool_choice": "auto"}, "tool_choice"),
    ({"logprobs": True}, "logprobs"), ({"stop": "x"}, "stop"), ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"response_format": {"type": "json_schema"}}, "response_format"), ({"store": True}, "store"),
    ({"reasoning_effort": "low"}, "reasoning_effort"),
    ({"modalities": ["audio", "audio"]}, "modalities"), ({"modalities": ["text", "video"]}, "modalities"),
    ({"modalities": ["text", "audio"], "speaker": 5}, "speaker"),
    ({"modalities": ["text", "audio"], "speaker": "aiden", "audio": {"voice": "ethan", "format": "wav"}}, "speaker"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "ethan"}}, "audio.format"),
    ({"modalities": ["text", "audio"], "audio": {"format": "wav"}}, "audio.voice"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "ogg"}}, "audio.format"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "zed", "format": "wav"}}, "audio.voice"),
    ({"audio": {"voice": "ethan", "format": "wav"}}, "audio"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_completion_tokens": 5000}, "max_completion_tokens"),
    ({"max_tokens": 5, "max_completion_tokens": 6}, "max_tokens"),
    ({"temperature": "hot"}, "temperature"), ({"temperature": 0.001}, "temperature"),
    ({"top_p": 1.5}, "top_p"), ({"seed": -1}, "seed"), ({"seed": 1.5}, "seed"),
    ({"top_k": 5000}, "top_k"), ({"speaker": "ethan"}, "speaker"), ({"return_audio": True}, "return_audio"),
    ({"system": "x"}, "system"), ({"unheard_of": 1}, "unheard_of"),
    ({"model": ""}, "model"), ({"messages": []}, "messages"), ({"messages": None}, "messages"),
    ({"messages": [{"role": "assistant", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "  "}]}, "messages[0].content"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "messages[0].content[0].input_audio"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": 5}}]}]},
     "messages[0].content[0].input_audio.data"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "A", "rate": 1}}]}]},
     "messages[0].content[0].input_audio.rate"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": 5}}]}]},
     "messages[0].content[0].image_url.url"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x", "detail": "max"}}]}]},
     "messages[0].content[0].image_url.detail"),
    ({"messages": [{"role": "user", "content": [{"type": "audio_url", "audio_url": {"url": 5}}]}]},
     "messages[0].content[0].audio_url.url"),
    ({"messages": [{"role": "user", "content": [{"type": "audio_url", "audio_url": {"url": "x", "fps": 2}}]}]},
     "messages[0].content[0].audio_url.fps"),
    ({"messages": [{"role": "user", "content": [{"type": "audio_url"}]}]}, "messages[0].content[0].audio_url"),
    ({"messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": "x"}}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "file", "file": {}}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": "x\ud800"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x", "tool_call_id": "1"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "assistant", "audio": {"id": "audio_gone"}}, USER]}, "messages[0].audio.id"),
])
def test_bad_fields_name_themselves(body, param):
    assert error_of(build, **body).param == param


def test_unknown_key_that_is_no_name_is_not_echoed():
    assert error_of(parse_chat_body, {"model": "m", "messages": [USER], "a b": 1}).param is None


def test_an_earlier_audio_answer_by_id_brings_its_transcript():
    transcripts = AudioTranscripts()
    expires = transcripts.remember("audio_1", "I said this.")
    assert expires > 0
    req = parse_chat_body({"model": "chatty", "messages": [USER, {"role": "assistant", "audio": {"id": "audio_1"}},
                                                           {"role": "user", "content": "And?"}]}, transcripts)
    assert req.history[1] == {"role": "assistant", "content": "I said this."}
    expired = AudioTranscripts(ttl_s=-1)
    expired.remember("audio_2", "gone")
    assert expired.get("audio_2") is None


def test_triton_errors_name_the_request_field():
    _, triton = build(messages=[{"role": "system", "content": "S"}, USER, {"role": "assistant", "content": "A"},
                                {"role": "user", "content": "Q"}], max_tokens=9)
    assert isinstance(triton, ChatTritonRequest)
    cases = {"invalid_request: text: too long": "messages[3].content",
             "invalid_request: messages[1].content: the template refused it": "messages[2].content",
             "invalid_request: max_tokens: too many": "max_tokens",
             "invalid_request: talker_top_k: no": "talker_top_k"}
    for message, param in cases.items():
        error = chat_error(from_triton(message), triton)
        assert error.param == param and error.message.startswith(param + ":"), (message, error.message)
    busy = chat_error(from_triton("unavailable: busy: full"), triton)
    assert busy.status == 429


def test_sized_wav_fills_in_the_streaming_header():
    enc = WavEncoder(24000)
    import numpy as np
    data = enc.encode(np.zeros(100, np.float32)) + enc.finish()
    whole = sized_wav(data)
    assert struct.unpack_from("<I", whole, 4)[0] == len(data) - 8
    assert struct.unpack_from("<I", whole, 40)[0] == 200
    assert sized_wav(b"not a wav") == b"not a wav"


def test_sized_flac_fills_in_the_sample_count():
    import io

    import numpy as np
    import soundfile as sf

    from client.speech_api.chat_completion import sized_flac
    from client.speech_api.encoders import make_encoder

    enc = make_encoder("flac", 24000)
    x = (np.sin(np.arange(30000) / 10) * 0.3).astype(np.float32)
    data = enc.encode(x[:10000]) + enc.encode(x[10000:]) + enc.finish()
    y, rate = sf.read(io.BytesIO(sized_flac(data, x.size)), dtype="float32")
    assert rate == 24000 and y.size == x.size and np.abs(y - x).max() < 1e-4


def test_stop_sequences_go_to_a_model_that_takes_them_and_are_refused_by_one_that_does_not():
    stopping = describe_pipeline("chatty", json.dumps({**json.loads(CATALOG), "params": [
        *json.loads(CATALOG)["params"], {"name": "stop", "type": "list"}]}))

    def params(**body):
        return build_chat_params(parse_chat_body({"model": "chatty", "messages": [USER], **body}), stopping).params
    assert params(stop="END")["stop"] == ["END"]
    assert params(stop=["a", "\n\n"])["stop"] == ["a", "\n\n"]
    assert "stop" not in params(stop=[]) and "stop" not in params(stop=None)
    for bad, param in (({"stop": 5}, "stop"), ({"stop": ["a", 3]}, "stop"), ({"stop": ["a", "\ud800"]}, "stop[1]")):
        assert error_of(params, **bad).param == param
    refused = error_of(build, stop="END")   # a model without stop sequences
    assert refused.param == "stop" and refused.code == "unsupported_parameter"


def test_system_messages_anywhere_go_to_the_model_in_place():
    """OpenAI takes system (and developer) messages anywhere, several times; the first, when it
    leads, is the `system` parameter, every other stays where it stands in `messages` (the
    checkpoint's chat template renders them, as the reference's)."""
    _, triton = build(messages=[{"role": "system", "content": "A"}, {"role": "developer", "content": "B"}, USER,
                                {"role": "assistant", "content": "Hello."}, {"role": "system", "content": "C"},
                                {"role": "user", "content": "Q"}])
    assert triton.text == "Q" and triton.params["system"] == "A"
    assert [(m["role"], m["content"]) for m in triton.params["messages"]] == [
        ("system", "B"), ("user", "Hi there."), ("assistant", "Hello."), ("system", "C")]
