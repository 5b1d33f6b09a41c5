from __future__ import annotations

import json
import re

import pytest

from omni_backend.models.hibari.adapter import HibariAdapter
from omni_backend.models.qwen3_tts.adapter import Qwen3TTSAdapter
from omni_backend.adapters.base import MAX_PARAMS_BYTES
from omni_backend.errors import InvalidRequest

# What every error must look like: the code, a field name, then a message without a traceback.
ERROR = re.compile(r"invalid_request: (?P<field>[A-Za-z_][A-Za-z0-9_]*): (?P<detail>.+)", re.S)


@pytest.fixture
def hibari():
    return HibariAdapter.from_model("builtin:hibari")


def test_defaults(hibari):
    assert hibari.validate("Hi.", None) == {"text": "Hi.", "voice": "heart", "speed": 1.0, "seed": 0}


def test_voice_is_case_insensitive_and_ints_are_accepted_for_floats(hibari):
    r = hibari.validate(b"Hi.", b'{"voice": "Heart", "speed": 2, "seed": 5}')
    assert r["voice"] == "heart" and r["speed"] == 2.0 and r["seed"] == 5


# Each bad TEXT / PARAMS the entry model may receive, as bytes (what Triton hands over) or str,
# with the field its error must name.
BAD_INPUTS = {
    "empty": ("", None, "text"),
    "blank": (" \n\t", None, "text"),
    "too long": ("x" * 4097, None, "text"),
    "too many bytes": ("é".encode() * 8193, None, "text"),
    "invalid utf-8": (b"\xff", None, "text"),
    "truncated utf-8": (b"caf\xc3", None, "text"),
    "overlong utf-8": (b"\xc0\xaf", None, "text"),
    "encoded surrogate": (b"\xed\xa0\x80 hi", None, "text"),
    "str surrogate": ("\ud800 hi", None, "text"),
    "nul byte": (b"hi\x00there", None, "text"),
    "only nul": (b"\x00", None, "text"),
    "text not a string": (5, None, "text"),
    "malformed json": ("Hi", "{", "params"),
    "trailing garbage": ("Hi", '{"speed": 1} x', "params"),
    "number": ("Hi", "3", "params"),
    "array": ("Hi", "[]", "params"),
    "string": ("Hi", '"speed"', "params"),
    "null": ("Hi", "null", "params"),
    "params invalid utf-8": ("Hi", b'{"voice": "\xff"}', "params"),
    "params encoded surrogate": ("Hi", b'{"voice": "\xed\xa0\x80"}', "params"),
    "escaped surrogate value": ("Hi", b'{"voice": "\\ud800"}', "voice"),
    "escaped low surrogate": ("Hi", b'{"voice": "heart\\udfff"}', "voice"),
    "escaped surrogate key": ("Hi", b'{"\\udc00": 1}', "params"),
    "escaped nul": ("Hi", b'{"voice": "he\\u0000art"}', "voice"),
    "deep array": ("Hi", b"[" * 100_000, "params"),
    "deep value": ("Hi", b'{"speed": ' + b"[" * 100_000, "params"),
    "deep object": ("Hi", b'{"a":' * 50_000, "params"),
    "nested value": ("Hi", b'{"speed": ' + b"[" * 500 + b"]" * 500 + b"}", "speed"),
    "huge": ("Hi", json.dumps({"voice": "x" * MAX_PARAMS_BYTES}), "params"),
    "unknown key": ("Hi", '{"pitch": 1}', "pitch"),
    "odd key": ("Hi", '{"a b: c": 1}', "params"),
    "long key": ("Hi", json.dumps({"k" * 10_000: 1}), "params"),
    "nan": ("Hi", '{"speed": NaN}', "speed"),
    "infinity": ("Hi", '{"speed": Infinity}', "speed"),
    "overflowing float": ("Hi", '{"speed": 1e400}', "speed"),
    "400-digit int for a float": ("Hi", '{"speed": 1' + "0" * 400 + "}", "speed"),
    "5000-digit int": ("Hi", '{"seed": 1' + "0" * 5000 + "}", "params"),
    "-infinity seed": ("Hi", '{"seed": -Infinity}', "seed"),
    "speed low": ("Hi", '{"speed": 0.49}', "speed"),
    "speed high": ("Hi", '{"speed": 2.01}', "speed"),
    "speed string": ("Hi", '{"speed": "fast"}', "speed"),
    "speed bool": ("Hi", '{"speed": true}', "speed"),
    "speed array": ("Hi", '{"speed": [1]}', "speed"),
    "seed fraction": ("Hi", '{"seed": 1.5}', "seed"),
    "seed negative": ("Hi", '{"seed": -1}', "seed"),
    "seed 2**63": ("Hi", '{"seed": 9223372036854775808}', "seed"),
    "seed bool": ("Hi", '{"seed": true}', "seed"),
    "seed string": ("Hi", '{"seed": "1"}', "seed"),
    "voice number": ("Hi", '{"voice": 3}', "voice"),
    "voice object": ("Hi", '{"voice": {"id": "heart"}}', "voice"),
    "voice unknown": ("Hi", '{"voice": "nobody"}', "voice"),
    "voice long": ("Hi", json.dumps({"voice": "n" * 5000}), "voice"),
}


@pytest.mark.parametrize("text,params,field", BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_errors_name_the_field(hibari, text, params, field):
    with pytest.raises(InvalidRequest) as e:
        hibari.validate(text, params)
    message = str(e.value)
    match = ERROR.fullmatch(message)
    assert match and match["field"] == field, message
    # Short, sendable back through Triton (valid UTF-8), and no repr of a traceback.
    assert len(message) < 400 and "Traceback" not in message, message
    message.encode("utf-8")


def test_params_bytes_limit_is_per_adapter():
    from omni_backend.models.qwen3_tts.adapter import REF_AUDIO_MAX_CHARS, Qwen3TTSAdapter

    assert Qwen3TTSAdapter.max_params_bytes > REF_AUDIO_MAX_CHARS
    assert HibariAdapter.max_params_bytes == MAX_PARAMS_BYTES


def test_blank_params_and_null_values_mean_defaults(hibari):
    defaults = {"text": "Hi", "voice": "heart", "speed": 1.0, "seed": 0}
    assert hibari.validate(b"Hi", b"  ") == defaults
    assert hibari.validate(b"Hi", b'{"voice": null, "speed": null}') == defaults
    assert hibari.validate("Hi \U0001F642", b'{"speed": 2}')["text"] == "Hi \U0001F642"   # astral: not a surrogate


@pytest.fixture(scope="module")
def qwen3_adapters(qwen3_tiny_vd):
    from omni_backend.models.qwen3_tts.builtin import resolve_checkpoint

    make = Qwen3TTSAdapter.from_model
    return {"cv": make(resolve_checkpoint("builtin:qwen3_tts_tiny_random")), "vd": make(str(qwen3_tiny_vd))}


# (checkpoint kind, PARAMS): VoiceDesign takes instructions, so they reach the tokenizer there.
QWEN3_BAD = {
    "instructions surrogate": ("vd", '{"instructions": "calm \\ud800"}'),
    "instructions nul": ("vd", '{"instructions": "calm\\u0000"}'),
    "language surrogate": ("cv", '{"language": "\\udbff"}'),
    "voice nul": ("cv", '{"voice": "vivian\\u0000"}'),
    "temperature 400 digits": ("cv", '{"temperature": 1' + "0" * 400 + "}"),
    "top_k infinity": ("cv", '{"top_k": 1e400}'),
    "top_p zero": ("cv", '{"top_p": 0}'),
    "max_new_tokens zero": ("cv", '{"max_new_tokens": 0}'),
    "task_type number": ("cv", '{"task_type": 5}'),
    "ref_text on custom voice": ("cv", '{"ref_text": "x"}'),
    "voice too long": ("cv", json.dumps({"voice": "v" * 65})),
}


@pytest.mark.parametrize("kind,params", QWEN3_BAD.values(), ids=QWEN3_BAD.keys())
def test_qwen3_errors_name_the_field(qwen3_adapters, kind, params):
    field = next(iter(json.loads(params)))
    with pytest.raises(InvalidRequest) as e:
        qwen3_adapters[kind].validate(b"Hello.", params.encode())
    assert ERROR.fullmatch(str(e.value))["field"] == field, str(e.value)
    str(e.value).encode("utf-8")


def test_temperature_zero_is_greedy(qwen3_adapters):
    """As OpenAI's and vLLM's APIs (`vllm bench serve --temperature 0`): 0 means greedy, and asking
    for sampling with it is an error naming temperature."""
    from omni_backend.models.orpheus.adapter import OrpheusAdapter

    for adapter in (qwen3_adapters["cv"], OrpheusAdapter()):
        r = adapter.validate(b"Hello.", b'{"temperature": 0}')
        assert r["do_sample"] is False and r["temperature"] is None
        assert adapter.validate(b"Hello.", b'{"temperature": 0.7}')["temperature"] == 0.7
        with pytest.raises(InvalidRequest) as e:
            adapter.validate(b"Hello.", b'{"temperature": 0, "do_sample": true}')
        assert ERROR.fullmatch(str(e.value))["field"] == "temperature"


def test_a_list_param_takes_finite_numbers_only():
    from omni_backend.adapters.base import Param

    spec = Param("speaker_embedding", list, max_len=3)
    assert spec.check([1, 2.5, -3]) == [1.0, 2.5, -3.0] and spec.check(None) is None
    for bad in ([], "1,2", [1, True], [1, float("nan")], [10**400], [1, 2, 3, 4], [[1]]):
        with pytest.raises(InvalidRequest) as e:
            spec.check(bad)
        assert ERROR.fullmatch(str(e.value))["field"] == "speaker_embedding", bad
    assert Param.from_dict(spec.to_dict()) == spec
