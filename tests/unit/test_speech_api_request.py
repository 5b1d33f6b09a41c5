"""The speech request: OpenAI fields, extensions, and what goes to each pipeline."""
from __future__ import annotations

import pytest

from client.speech_api.catalog import Catalog, FieldSpec, PipelineInfo, describe_pipeline
from client.speech_api.errors import ApiError
from client.speech_api.request import build_triton_params, parse_speech_body

BASE = {"model": "tts-1", "input": "Hello.", "voice": "alloy"}


@pytest.fixture(scope="module")
def hibari() -> PipelineInfo:
    from ensemble_builder.build import catalog
    from omni_backend.families import get_pipeline

    return describe_pipeline("hibari", catalog(get_pipeline("hibari"), "builtin:hibari"))


def error_of(fn, *args) -> ApiError:
    with pytest.raises(ApiError) as e:
        fn(*args)
    return e.value


def test_defaults_and_openai_fields():
    req = parse_speech_body({**BASE, "voice": {"id": "heart"}, "instructions": "calm", "speed": 2})
    assert (req.model, req.input, req.voice) == ("tts-1", "Hello.", "heart")
    assert (req.response_format, req.stream_format, req.speed) == ("mp3", "audio", 2.0)
    assert req.instructions == "calm" and req.extensions == {}
    nulls = parse_speech_body({**BASE, "instructions": None, "speed": None, "response_format": None})
    assert nulls.speed == 1.0 and nulls.response_format == "mp3"


@pytest.mark.parametrize("body,param", [
    ([], None), ({"input": "x", "voice": "a", "model": " "}, "model"), ({**BASE, "input": ""}, "input"),
    ({**BASE, "voice": "a", "speaker": "b"}, "speaker"),
    ({**BASE, "input": "y" * 4097}, "input"), ({**BASE, "voice": {"id": 3}}, "voice"),
    ({**BASE, "speed": 0.24}, "speed"), ({**BASE, "speed": float("nan")}, "speed"),
    ({**BASE, "response_format": "MP3"}, "response_format"), ({**BASE, "stream_format": "ws"}, "stream_format"),
    ({**BASE, "seed": "1"}, "seed"), ({**BASE, "max_new_tokens": 0}, "max_new_tokens"),
    ({**BASE, "ref_audio": "data:audio/wav;base64,@@@"}, "ref_audio"), ({**BASE, "ref_audio": "/etc/passwd"}, "ref_audio"),
    ({**BASE, "ref_audio": "file:///etc/passwd"}, "ref_audio"), ({**BASE, "ref_audio": "  "}, "ref_audio"),
    ({**BASE, "ref_audio": "data:audio/wav,AAAA"}, "ref_audio"),
    # Strings that could not even be encoded for Triton, or that the entry model refuses:
    ({**BASE, "input": "\ud800 hi"}, "input"), ({**BASE, "input": "hi\x00"}, "input"),
    ({**BASE, "model": "tts-1\udfff"}, "model"), ({**BASE, "voice": "alloy\ud800"}, "voice"),
    ({**BASE, "voice": {"id": "\udc80"}}, "voice"), ({**BASE, "instructions": "calm\ud800"}, "instructions"),
    ({**BASE, "language": "\ud800"}, "language"), ({**BASE, "ref_text": "\x00"}, "ref_text"),
    ({**BASE, "response_format": "mp3\ud800"}, "response_format"),
    # vLLM-Omni's fields: `stream` and `ignore_eos` are booleans; a whole file is no SSE stream
    ({**BASE, "stream": "true"}, "stream"), ({**BASE, "ignore_eos": 1}, "ignore_eos"),
    ({**BASE, "stream": False, "stream_format": "sse"}, "stream"),
    # Numbers that overflow float() or print as 400 digits:
    ({**BASE, "speed": 10**400}, "speed"), ({**BASE, "seed": 10**400}, "seed"),
    ({**BASE, "speed": float("inf")}, "speed"), ({**BASE, "seed": float("-inf")}, "seed"),
    # Keys that are no field name are not echoed as `param`:
    ({**BASE, "\ud800": 1}, None), ({**BASE, "k" * 10_000: 1}, None),
])
def test_shape_errors_name_the_field(body, param):
    e = error_of(parse_speech_body, body)
    assert e.status == 400 and e.param == param and e.type == "invalid_request_error"
    assert len(e.message) < 600, e.message
    e.body().decode("ascii")


def test_hibari_fields_come_from_its_adapter(hibari):
    assert hibari.known and set(hibari.fields) == {"voice", "speed", "seed"}
    assert hibari.voices == ["heart"] and hibari.default_voice == "heart"
    assert hibari.native_speed == (0.5, 2.0) and not hibari.clones_voices


@pytest.mark.parametrize("speed,native,stretch", [(1.0, 1.0, 1.0), (1.5, 1.5, 1.0), (0.5, 0.5, 1.0),
                                                  (0.25, 0.5, 0.5), (4.0, 2.0, 2.0), (3.0, 2.0, 1.5)])
def test_speed_maps_to_the_native_control_then_stretch(hibari, speed, native, stretch):
    t = build_triton_params(parse_speech_body({**BASE, "speed": speed}), hibari)
    assert (t.speed.native, t.speed.stretch) == (native, stretch)
    assert t.params.get("speed", 1.0) == native


def test_voices_and_stock_names(hibari):
    assert build_triton_params(parse_speech_body({**BASE, "voice": "Heart"}), hibari).params == {"voice": "heart"}
    assert build_triton_params(parse_speech_body({**BASE, "voice": "shimmer"}), hibari).params == {}
    e = error_of(build_triton_params, parse_speech_body({**BASE, "voice": "bob"}), hibari)
    assert e.param == "voice" and "heart" in e.message


def test_extensions_only_where_the_pipeline_takes_them(hibari):
    t = build_triton_params(parse_speech_body({**BASE, "seed": 5}), hibari)
    assert t.params == {"seed": 5}
    for field, value in [("language", "en"), ("task_type", "Base"), ("max_new_tokens", 10),
                         ("initial_codec_chunk_frames", 2)]:
        e = error_of(build_triton_params, parse_speech_body({**BASE, field: value}), hibari)
        assert e.param == field and e.code == "unsupported_parameter"
    e = error_of(build_triton_params, parse_speech_body({**BASE, "ref_text": "hi"}), hibari)
    assert e.param == "ref_text" and "does not clone" in e.message
    t = build_triton_params(parse_speech_body({**BASE, "instructions": "whisper"}), hibari)
    assert "instructions" not in t.params and t.ignored == ["instructions"]


def test_model_parameters_pass_by_name_once_the_model_is_known(hibari):
    """A key that is not OpenAI's nor a shared extension is one of the model's own parameters: a
    400 naming it when the model has no such parameter, checked by the model's validator when it
    has (hibari's `seed` range), and passed on for a model without a catalog."""
    e = error_of(build_triton_params, parse_speech_body({**BASE, "extra": 1}), hibari)
    assert e.status == 400 and e.param == "extra" and e.code == "unknown_parameter"
    assert "unknown field for model 'hibari'" in e.message and "voice" not in e.message.split("allowed:")[1].split(",")[-1]
    e = error_of(build_triton_params, parse_speech_body({**BASE, "text": "x"}), hibari)
    assert e.param == "text"
    unknown = PipelineInfo("other")
    assert build_triton_params(parse_speech_body({**BASE, "cfg_value": 2.0}), unknown).params["cfg_value"] == 2.0


def test_extension_names_follow_the_adapter():
    info = PipelineInfo(name="codec_model", fields={
        "voice": FieldSpec("voice"), "initial_chunk_frames": FieldSpec("initial_chunk_frames"),
        "instructions": FieldSpec("instructions"), "language": FieldSpec("language")})
    body = {**BASE, "voice": "ryan", "initial_codec_chunk_frames": 3, "language": "english", "instructions": "x"}
    t = build_triton_params(parse_speech_body(body), info)
    assert t.params == {"voice": "ryan", "initial_chunk_frames": 3, "language": "english", "instructions": "x"}
    assert t.speed.native == 1.0
    # no speed control of its own: the shim stretches all of it
    assert build_triton_params(parse_speech_body({**BASE, "speed": 3}), info).speed.stretch == 3.0
    # no known voices: a stock name leaves the choice to the model
    assert "voice" not in build_triton_params(parse_speech_body(BASE), info).params


def test_unknown_pipelines_pass_everything_to_triton():
    info = PipelineInfo(name="remote")
    body = {**BASE, "voice": "custom", "language": "de", "ref_audio": "data:audio/wav;base64,AAAA"}
    t = build_triton_params(parse_speech_body(body), info)
    assert t.params == {"voice": "custom", "language": "de", "ref_audio": "data:audio/wav;base64,AAAA"}


def test_catalog_aliases(hibari):
    catalog = Catalog("hibari", describe=lambda name, path: PipelineInfo(name=name))
    assert catalog.resolve("tts-1") is None
    catalog.learn("hibari", None)
    assert [catalog.resolve(m) for m in ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "hibari", "x")] == \
        ["hibari", "hibari", "hibari", "hibari", None]
    assert catalog.model_names() == ["hibari", "tts-1", "tts-1-hd", "gpt-4o-mini-tts"]


def test_default_model_of_a_request_without_one():
    catalog = Catalog("hibari", describe=lambda name, path: PipelineInfo(name=name))
    assert catalog.default_model() is None
    catalog.learn("qwen3_tts", None)
    assert catalog.default_model() == "qwen3_tts"       # the only one served
    catalog.learn("voxcpm2", None)
    assert catalog.default_model() is None              # which one is ambiguous
    catalog.learn("hibari", None)
    assert catalog.default_model() == "hibari"          # the one behind OpenAI's names


def test_served_model_names():
    """--served-model-name NAME=PIPELINE: the name resolves while its pipeline is served, is
    listed then, and may take over an OpenAI alias; a bad spec names itself."""
    from client.speech_api.catalog import parse_model_names

    names = parse_model_names(["Org/Model-1.7B=hibari", " tts-1 = qwen3 ", "Org/Gone=gone"])
    assert names == {"Org/Model-1.7B": "hibari", "tts-1": "qwen3", "Org/Gone": "gone"}
    catalog = Catalog("hibari", describe=lambda name, path: PipelineInfo(name=name), model_names=names)
    catalog.learn("hibari", None)
    assert [catalog.resolve(m) for m in ("Org/Model-1.7B", "tts-1", "tts-1-hd", "Org/Gone")] == \
        ["hibari", None, "hibari", None]
    assert catalog.model_names() == ["hibari", "Org/Model-1.7B", "tts-1-hd", "gpt-4o-mini-tts"]
    catalog.learn("qwen3", None)
    assert catalog.resolve("tts-1") == "qwen3" and "tts-1" in catalog.model_names()
    for bad in (["nothing"], ["=hibari"], ["x="], ["a=b", "a=c"]):
        with pytest.raises(ValueError, match="--served-model-name"):
            parse_model_names(bad)


def test_vllm_omni_benchmark_body():
    """What `vllm-omni bench serve --backend openai-audio-speech` posts: no voice, `stream`,
    `stream_format: audio`, `ignore_eos`."""
    body = {"model": "qwen3_tts", "input": "Hello.", "stream": True, "stream_format": "audio",
            "response_format": "pcm", "ignore_eos": True}
    req = parse_speech_body(body)
    assert req.voice is None and req.stream and req.stream_format == "audio"
    assert req.extensions == {"ignore_eos": True}
    assert parse_speech_body({**body, "stream": False}).stream is False
    assert parse_speech_body({k: v for k, v in body.items() if k != "stream"}).stream is True


def test_ignore_eos_and_no_voice_per_pipeline(hibari):
    info = describe_pipeline("qwen3_tts", '{"params": [{"name": "voice", "type": "str"}, '
                                          '{"name": "ignore_eos", "type": "bool"}], '
                                          '"voices": ["ryan", "vivian"], "default_voice": "vivian"}')
    assert info.default_voice == "vivian" and info.voices == ["ryan", "vivian"]
    no_voice = {"model": "qwen3_tts", "input": "Hello.", "ignore_eos": True}
    # no voice: the model's default (it is left out, the model picks it)
    assert build_triton_params(parse_speech_body(no_voice), info).params == {"ignore_eos": True}
    assert build_triton_params(parse_speech_body({**no_voice, "voice": "ryan"}), info).params == \
        {"ignore_eos": True, "voice": "ryan"}
    # stopping at eos is every pipeline's own behaviour; asking for the opposite is refused
    assert build_triton_params(parse_speech_body({**BASE, "ignore_eos": False}), hibari).params == {}
    e = error_of(build_triton_params, parse_speech_body({**BASE, "ignore_eos": True}), hibari)
    assert e.param == "ignore_eos" and e.code == "unsupported_parameter"
    assert build_triton_params(parse_speech_body({"model": "tts-1", "input": "Hi."}), hibari).params == {}


def test_vllm_omni_request_shapes():
    """vLLM-Omni's speech API: `model` may be left out (the server's default model), `speaker`
    is `voice`'s other name, a preset voice beside `ref_audio` is the recording's voice (the
    voice is reported as ignored), and a model that limits its steps as `max_len` takes
    `max_new_tokens` there."""
    assert parse_speech_body({"input": "Hi."}).model is None
    no_voice = {k: v for k, v in BASE.items() if k != "voice"}
    assert parse_speech_body({**no_voice, "speaker": "ryan"}).voice == "ryan"
    assert parse_speech_body({**no_voice, "speaker": "ryan", "voice": "ryan"}).voice == "ryan"
    base = describe_pipeline("qwen3_tts_base", '{"params": [{"name": "voice", "type": "str"}, '
                                               '{"name": "ref_audio", "type": "str"}, '
                                               '{"name": "ref_text", "type": "str"}], "clones_voices": true}')
    clone = {"model": "qwen3_tts_base", "input": "Hi.", "voice": "vivian", "ref_text": "Hello there.",
             "ref_audio": "data:audio/wav;base64,UklGRg=="}
    request = build_triton_params(parse_speech_body(clone), base)
    assert "voice" not in request.params and request.ignored == ["voice"]
    assert build_triton_params(parse_speech_body({**clone, "voice": "alloy"}), base).ignored == []
    patches = describe_pipeline("voxcpm2", '{"params": [{"name": "max_len", "type": "int", "lo": 1}], '
                                           '"clones_voices": true}')
    assert build_triton_params(parse_speech_body({**BASE, "max_new_tokens": 40}), patches).params == {"max_len": 40}


def test_ref_audio_as_bare_base64_becomes_a_data_url():
    """vLLM-Omni's clients may send `ref_audio` as bare base64 (line breaks of a wrapped encoder
    included): it goes on as a data URL of the same bytes."""
    import base64 as b64

    payload = b64.b64encode(b"RIFF" + bytes(range(200))).decode()
    wrapped = "\n".join(payload[i:i + 76] for i in range(0, len(payload), 76))
    for value in (payload, wrapped):
        got = parse_speech_body({**BASE, "ref_audio": value}).extensions["ref_audio"]
        head, _, data = got.partition(",")
        assert head == "data:application/octet-stream;base64" and data == payload
    url = "data:audio/wav;base64," + payload
    assert parse_speech_body({**BASE, "ref_audio": url}).extensions["ref_audio"] == url
