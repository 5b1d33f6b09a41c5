"""vLLM-Omni's `sampling_params_list` on a chat body (client/speech_api/stage_sampling.py): the
thinker's and talker's entries become the pipeline's sampling fields, the stages a request does not
run are checked and not used, and anything the pipeline cannot honour is a 400 naming it."""
from __future__ import annotations

import json

import pytest

from client.speech_api.catalog import describe_pipeline
from client.speech_api.chat_request import build_chat_params, parse_chat_body
from client.speech_api.errors import ApiError
from tests.vllm_omni_requests import CODE2WAV, TALKER, THINKER

CATALOG = json.dumps({
    "chat": True, "sample_rate": 24000, "voices": ["ethan"],
    # what the Qwen3-Omni adapter declares (its stage_sampling)
    "stage_sampling": [
        {"stage": "thinker", "stop_token_ids": [151645], "detokenize": True,
         "fields": {k: k for k in ("temperature", "do_sample", "top_p", "top_k", "max_tokens", "repetition_penalty",
                                   "seed")}},
        {"stage": "talker", "audio_only": True, "detokenize": False, "stop_token_ids": [2150],
         "fields": {"temperature": "talker_temperature", "do_sample": "talker_do_sample", "top_p": "talker_top_p",
                    "top_k": "talker_top_k", "max_tokens": "talker_max_new_tokens",
                    "repetition_penalty": "talker_repetition_penalty", "seed": "seed"}},
        {"stage": "code2wav"}],
    "params": [{"name": n, "type": t} for n, t in (
        ("messages", "list"), ("system", "str"), ("speaker", "str"), ("return_audio", "bool"), ("max_tokens", "int"),
        ("do_sample", "bool"), ("temperature", "float"), ("top_k", "int"),
        ("repetition_penalty", "float"), ("seed", "int"), ("talker_do_sample", "bool"),
        ("talker_temperature", "float"), ("talker_top_k", "int"), ("talker_top_p", "float"),
        ("talker_repetition_penalty", "float"), ("talker_max_new_tokens", "int"))]
    + [{"name": "top_p", "type": "float", "lo": 0.001, "hi": 1.0}]})
INFO = describe_pipeline("omni", CATALOG)
AUDIO = {"modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "wav"}}


def params(**body) -> dict:
    req = parse_chat_body({"model": "omni", "messages": [{"role": "user", "content": "Hi"}], **body})
    return build_chat_params(req, INFO).params


def error(**body) -> ApiError:
    with pytest.raises(ApiError) as e:
        params(**body)
    return e.value


def test_the_example_clients_list_maps_to_the_stages():
    spoken = params(sampling_params_list=[THINKER, TALKER, CODE2WAV], **AUDIO)
    assert spoken == {"speaker": "ethan", "do_sample": True, "temperature": 0.4, "top_p": 0.9, "top_k": 1,
                      "max_tokens": 16384, "repetition_penalty": 1.05, "seed": 42, "talker_do_sample": True,
                      "talker_temperature": 0.9, "talker_top_k": 50, "talker_max_new_tokens": 4096,
                      "talker_repetition_penalty": 1.05}
    # a text answer runs no talker: its entry is checked, not used
    text = params(sampling_params_list=[THINKER, TALKER, CODE2WAV])
    assert text == {"return_audio": False, "do_sample": True, "temperature": 0.4, "top_p": 0.9, "top_k": 1,
                    "max_tokens": 16384, "repetition_penalty": 1.05, "seed": 42}
    greedy = params(sampling_params_list=[{"temperature": 0, "top_k": -1}, {"temperature": 0.0}], **AUDIO)
    assert greedy == {"speaker": "ethan", "do_sample": False, "top_k": 0, "talker_do_sample": False}
    # the same value set two ways is fine
    assert params(temperature=0.4, sampling_params_list=[{"temperature": 0.4}])["temperature"] == 0.4


@pytest.mark.parametrize("value, field, says", [
    ({"x": 1}, "sampling_params_list", "must be a list"),
    ([THINKER, TALKER, CODE2WAV, {}], "sampling_params_list", "must be a list"),
    (["hot"], "sampling_params_list[0]", "must be an object"),
    ([{"min_p": 0.1}], "sampling_params_list[0]", "'min_p' is not supported"),
    ([{"stop_token_ids": [151643]}], "sampling_params_list[0].stop_token_ids", "own stop tokens ([151645])"),
    ([{}, {"stop_token_ids": [151645]}], "sampling_params_list[1].stop_token_ids", "own stop tokens ([2150])"),
    ([{"detokenize": False}], "sampling_params_list[0].detokenize", "returns text"),
    ([{}, {"detokenize": True}], "sampling_params_list[1].detokenize", "returns no text"),
    ([{"temperature": "hot"}], "sampling_params_list[0].temperature", "must be a number"),
    ([{}, {"temperature": -1}], "sampling_params_list[1].temperature", "must be >= 0"),
    ([{"seed": 1.5}], "sampling_params_list[0].seed", "must be an integer"),
    ([{"top_p": 7}], "sampling_params_list[0].top_p", "top_p"),
    ([{"temperature": 0.9}], "sampling_params_list[0].temperature", "differs from the temperature"),
])
def test_what_cannot_be_honoured_is_a_400_naming_it(value, field, says):
    e = error(sampling_params_list=value, temperature=0.4)
    assert e.status == 400 and e.param == field and says in e.message, e.message


def test_one_seed_serves_both_models():
    assert error(sampling_params_list=[{"seed": 1}, {"seed": 2}], **AUDIO).param == "sampling_params_list[1].seed"
    assert params(sampling_params_list=[{"seed": 3}, {"seed": 3}], **AUDIO)["seed"] == 3


def test_the_example_curl_scripts_empty_processor_options_pass():
    """vLLM-Omni's curl script always sends `mm_processor_kwargs: {}` and `modalities: null`."""
    assert params(mm_processor_kwargs={}, modalities=None) == {"return_audio": False}
    assert params(mm_processor_kwargs={"use_audio_in_video": False}) == {"return_audio": False}
    assert error(mm_processor_kwargs={"use_audio_in_video": True}).param == "mm_processor_kwargs"


def test_a_model_without_stages_to_sample_refuses_the_list():
    plain = describe_pipeline("plain", json.dumps({"chat": True, "params": [{"name": "messages", "type": "list"}]}))
    req = parse_chat_body({"model": "plain", "messages": [{"role": "user", "content": "Hi"}],
                           "sampling_params_list": [THINKER]})
    with pytest.raises(ApiError) as e:
        build_chat_params(req, plain)
    assert e.value.param == "sampling_params_list" and "no per-stage sampling" in e.value.message


def test_the_adapters_declaration_is_what_the_list_maps_to(tmp_path):
    """The Qwen3-Omni adapter's `stage_sampling` (in the committed repository's catalog) is the one
    these tests use, ids taken from its checkpoint."""
    from ensemble_builder.build import catalog
    from omni_backend.families import get_pipeline

    described = json.loads(catalog(get_pipeline("qwen3_omni_tiny_random"), "builtin:qwen3_omni_tiny_random"))
    assert described["stage_sampling"] == json.loads(CATALOG)["stage_sampling"]
