"""Orpheus voices come from the deploy: a finetune names its own (the lm stage's option `voices`,
the first the default), a pretrained checkpoint takes none; the speech API lists and checks them,
names matching whatever their case and reaching the prompt as the deploy writes them."""
from __future__ import annotations

import pytest

from client.speech_api.catalog import describe_pipeline
from client.speech_api.errors import ApiError
from client.speech_api.request import build_triton_params, parse_speech_body
from ensemble_builder.build import catalog
from omni_backend.deploy import check_options, parse_deploy
from omni_backend.errors import InvalidRequest
from omni_backend.families import get_pipeline
from omni_backend.models.orpheus.adapter import OrpheusAdapter
from omni_backend.models.orpheus.tokens import VOICES, voice_names

PIPELINE = "orpheus_tiny_random"
MODEL = "builtin:orpheus_tiny_random"


def _deploy(voices: str | None):
    options = {} if voices is None else {"options": {"voices": voices}}
    raw = {"pipeline": PIPELINE, "stages": [{"stage_id": 1}, {"stage_id": 0, "engine": "torch", **options}]}
    return check_options(parse_deploy(raw, "finetune.yaml"), get_pipeline(PIPELINE))


def _speech(voices: str | None, body: dict) -> dict:
    info = describe_pipeline(PIPELINE, catalog(get_pipeline(PIPELINE), MODEL, _deploy(voices)))
    return build_triton_params(parse_speech_body({"model": PIPELINE, "input": "Bonjour.", **body}), info).params


def test_the_released_voices_are_the_default():
    adapter = OrpheusAdapter.from_model(MODEL, _deploy(None))
    assert adapter.describe()["voices"] == list(VOICES)
    assert adapter.validate("Hi.", {})["voice"] == "tara"
    assert adapter.validate("Hi.", {"voice": "LEO"})["voice"] == "leo"


def test_a_finetunes_voices_are_listed_checked_and_kept_as_written():
    adapter = OrpheusAdapter.from_model(MODEL, _deploy("Pierre, amelie , 유나"))
    assert adapter.describe()["voices"] == ["Pierre", "amelie", "유나"]
    assert adapter.validate("Salut.", {})["voice"] == "Pierre"
    assert adapter.validate("Salut.", {"voice": "pierre"})["voice"] == "Pierre"
    with pytest.raises(InvalidRequest) as e:
        adapter.validate("Salut.", {"voice": "tara"})
    assert e.value.field == "voice" and "Pierre, amelie, 유나" in e.value.reason
    # through the speech API: listed, the first the default, any case, unknown names a 400
    info = describe_pipeline(PIPELINE, catalog(get_pipeline(PIPELINE), MODEL, _deploy("Pierre, amelie")))
    assert info.voices == ["Pierre", "amelie"] and info.default_voice == "Pierre"
    assert _speech("Pierre, amelie", {"voice": "PIERRE"})["voice"] == "Pierre"
    assert "voice" not in _speech("Pierre, amelie", {"voice": "alloy"})   # stock name: the default
    with pytest.raises(ApiError) as api:
        _speech("Pierre, amelie", {"voice": "tara"})
    assert api.value.status == 400 and api.value.param == "voice"


def test_a_checkpoint_without_voices_takes_the_text_alone():
    adapter = OrpheusAdapter.from_model(MODEL, _deploy(""))
    assert adapter.describe()["voices"] == [] and "voice" not in adapter.param_specs()
    assert adapter.validate("Hi.", {}).get("voice") is None
    with pytest.raises(InvalidRequest) as e:
        adapter.validate("Hi.", {"voice": "tara"})
    assert e.value.field == "voice"
    assert "voice" not in _speech("", {"voice": "alloy"}) and "voice" not in _speech("", {})
    with pytest.raises(ApiError) as api:
        _speech("", {"voice": "tara"})
    assert api.value.status == 400 and api.value.param == "voice"


@pytest.mark.parametrize("listed,problem", [
    ("tara,,leo", "an empty name"), ("tara, Tara", "listed twice"), ("a:b", "not a voice name"),
    ("<custom_token_3>", "not a voice name"), ("x" * 65, "not a voice name"), ("tab\there", "not a voice name"),
])
def test_a_bad_voice_list_is_refused_naming_the_option(listed, problem):
    with pytest.raises(ValueError) as e:
        OrpheusAdapter.from_model(MODEL, _deploy(listed))
    assert "finetune.yaml: stages[1].options.voices:" in str(e.value) and problem in str(e.value)


def test_voice_names_keep_order_case_and_inner_spaces():
    assert voice_names(" Mary Ann, 长乐 ,zoe") == ("Mary Ann", "长乐", "zoe")
    assert voice_names("") == voice_names("  ") == ()
