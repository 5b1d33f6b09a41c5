from __future__ import annotations

import pytest

from omni_backend.adapters import adapter_class
from omni_backend.errors import InvalidRequest


@pytest.fixture
def hibari():
    return adapter_class("hibari").from_model("builtin:hibari")


def test_defaults(hibari):
    assert hibari.validate("Hi.", None) == {"text": "Hi.", "voice": "heart", "speed": 1.0, "seed": 0}


def test_voice_is_case_insensitive_and_ints_are_accepted_for_floats(hibari):
    r = hibari.validate(b"Hi.", b'{"voice": "Heart", "speed": 2, "seed": 5}')
    assert r["voice"] == "heart" and r["speed"] == 2.0 and r["seed"] == 5


@pytest.mark.parametrize("text,params,field", [
    ("", None, "text"), (" ", None, "text"), ("x" * 4097, None, "text"), (b"\xff", None, "text"),
    ("Hi", "{", "params"), ("Hi", "3", "params"), ("Hi", '{"pitch": 1}', "pitch"),
    ("Hi", '{"speed": 0.49}', "speed"), ("Hi", '{"speed": NaN}', "speed"), ("Hi", '{"seed": 1.5}', "seed"),
    ("Hi", '{"seed": true}', "seed"), ("Hi", '{"voice": 3}', "voice"),
])
def test_errors_name_the_field(hibari, text, params, field):
    with pytest.raises(InvalidRequest) as e:
        hibari.validate(text, params)
    assert str(e.value).startswith(f"invalid_request: {field}:")


def test_4096_characters_is_fine(hibari):
    assert len(hibari.validate("é" * 4096, None)["text"]) == 4096
