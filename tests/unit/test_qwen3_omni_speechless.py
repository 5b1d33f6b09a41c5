"""A Qwen3-Omni checkpoint that does not speak (config.json `enable_audio_output: false`, as the
released Thinking and Captioner checkpoints): its config is read without a talker section, its
requests are text-only with the audio fields refused by name, it loads the thinker alone, and the
speech API says so and refuses audio (tests/system/test_qwen3_omni_speechless.py serves it)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from client.speech_api.catalog import describe_pipeline
from client.speech_api.chat_request import build_chat_params, parse_chat_body
from client.speech_api.errors import ApiError
from ensemble_builder.build import catalog
from omni_backend.errors import InvalidRequest
from omni_backend.families import get_pipeline
from omni_backend.models.qwen3_omni.adapter import Qwen3OmniAdapter
from omni_backend.models.qwen3_omni.config import ConfigError, Qwen3OmniConfig, load_config


@pytest.fixture(scope="module")
def thinking(tmp_path_factory) -> Path:
    from omni_backend.models.qwen3_omni.random_checkpoint import write_random_checkpoint

    return Path(write_random_checkpoint(str(tmp_path_factory.mktemp("thinking") / "ckpt"), "tiny", speaks=False))


def test_the_config_needs_no_talker_section(thinking):
    raw = json.loads((thinking / "config.json").read_text())
    assert raw["enable_audio_output"] is False and load_config(str(thinking)).talker is None
    without = {k: v for k, v in raw.items() if k not in ("talker_config", "code2wav_config")}
    config = Qwen3OmniConfig.from_dict(without)
    assert config.talker is None and config.enable_audio_output is False
    with pytest.raises(ConfigError, match="talker_config: missing"):   # a checkpoint that speaks needs it
        Qwen3OmniConfig.from_dict({**without, "enable_audio_output": True})
    with pytest.raises(ConfigError, match="enable_audio_output: must be true or false"):
        Qwen3OmniConfig.from_dict({**raw, "enable_audio_output": "no"})


def test_the_checkpoint_holds_the_thinker_alone(thinking):
    from safetensors import safe_open

    from omni_backend.models.qwen3_omni.checkpoint import load_checkpoint

    with safe_open(str(thinking / "model.safetensors"), "pt") as f:
        names = list(f.keys())
    assert names and not [n for n in names if n.startswith(("talker.", "code2wav."))]
    assert load_checkpoint(str(thinking), parts=("thinker",)).thinker is not None
    with pytest.raises(ValueError, match="does not speak"):
        load_checkpoint(str(thinking), parts=("talker",))


def test_requests_are_text_only_and_audio_fields_are_refused(thinking):
    adapter = Qwen3OmniAdapter.from_model(str(thinking))
    described = adapter.describe()
    assert described["speaks"] is False and described["voices"] == [] and described["default_voice"] is None
    names = {p["name"] for p in described["params"]}
    assert "speaker" not in names and not [n for n in names if n.startswith("talker_") or n.endswith("chunk_frames")]
    request = adapter.validate("Hello?", {})
    assert request["return_audio"] is False and adapter.skipped_stages(request) == frozenset({1})
    for params, field in (({"return_audio": True}, "return_audio"), ({"speaker": "ethan"}, "speaker"),
                          ({"talker_top_k": 3}, "talker_top_k")):
        with pytest.raises(InvalidRequest) as e:
            adapter.validate("Hello?", params)
        assert e.value.field == field
    assert "does not speak" in str(pytest.raises(InvalidRequest, adapter.validate, "Hi", {"return_audio": True}).value)


def test_the_speech_api_refuses_audio_naming_modalities(thinking):
    info = describe_pipeline("qwen3_omni", catalog(get_pipeline("qwen3_omni"), str(thinking)))
    assert info.chat and not info.speaks and info.voices == []
    text = build_chat_params(parse_chat_body({"model": "qwen3_omni", "messages": [{"role": "user", "content": "Hi"}]}),
                             info)
    assert text.params["return_audio"] is False
    body = {"model": "qwen3_omni", "messages": [{"role": "user", "content": "Hi"}], "modalities": ["text", "audio"],
            "audio": {"voice": "ethan", "format": "wav"}}
    with pytest.raises(ApiError) as e:
        build_chat_params(parse_chat_body(body), info)
    assert e.value.status == 400 and e.value.param == "modalities" and "does not speak" in e.value.message


def test_the_repository_has_no_talker_or_code2wav_and_the_entry_calls_the_thinker_alone(thinking, tmp_path):
    """No model (so no stub process) for stages the checkpoint cannot run; a rebuild over a
    repository of a speaking checkpoint removes theirs."""
    import yaml

    from ensemble_builder.build import build
    from omni_backend.deploy import default_deploy_path

    deploy = yaml.safe_load(Path(default_deploy_path("qwen3_omni_tiny_random")).read_text())
    deploy.update(pipeline="qwen3_omni", model=str(thinking))
    (tmp_path / "deploy.yaml").write_text(yaml.safe_dump(deploy))
    repo = tmp_path / "repo"
    for stale in ("qwen3_omni__talker", "qwen3_omni__code2wav"):
        (repo / stale / "1").mkdir(parents=True)
    written = build("qwen3_omni", repo, tmp_path / "deploy.yaml")
    assert sorted(p.name for p in written) == ["qwen3_omni", "qwen3_omni__thinker"]
    assert sorted(p.name for p in repo.iterdir()) == ["qwen3_omni", "qwen3_omni__thinker"]
    entry = (repo / "qwen3_omni" / "config.pbtxt").read_text()
    stages = entry.split('key: "stages"')[1].split("string_value:")[1].split('"')[1]
    assert stages == "qwen3_omni__thinker"
    assert Qwen3OmniAdapter.from_model(str(thinking)).unserved_stages() == frozenset({1, 2})
    assert Qwen3OmniAdapter.from_model("builtin:qwen3_omni_tiny_random").unserved_stages() == frozenset()

