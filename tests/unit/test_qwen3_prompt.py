"""Prompt builder: validation errors name the request field, speakers are case-insensitive,
languages follow the reference (auto, explicit, dialects through the speaker), instructions,
and both text modes give the prefill the reference builds."""
from __future__ import annotations

import pytest
import torch

from omni_backend.errors import InvalidRequest
from omni_backend.models.qwen3_tts.prompt import PromptError, VoiceClonePrompt, embed_prompt

LANG = {"english": 2050, "chinese": 2055, "sichuan_dialect": 2062, "beijing_dialect": 2074, "french": 2061}
THINK, NOTHINK, THINK_BOS, THINK_EOS = 2154, 2155, 2156, 2157


@pytest.fixture(scope="module")
def cv(qwen3_loaded, qwen3_tiny_cv):
    return qwen3_loaded(qwen3_tiny_cv)


@pytest.fixture(scope="module")
def cv17(qwen3_loaded, qwen3_tiny2_cv):
    return qwen3_loaded(qwen3_tiny2_cv)


@pytest.fixture(scope="module")
def vd(qwen3_loaded, qwen3_tiny_vd):
    return qwen3_loaded(qwen3_tiny_vd)


@pytest.fixture(scope="module")
def base(qwen3_loaded, qwen3_checkpoint_factory):
    return qwen3_loaded(qwen3_checkpoint_factory("tiny", "base"))


def _error(builder, field, match, **kwargs):
    kwargs.setdefault("text", "Hello.")
    with pytest.raises(PromptError, match=match) as info:
        builder.build(**kwargs)
    assert info.value.field == field
    assert isinstance(info.value, ValueError) and isinstance(info.value, InvalidRequest)
    assert str(info.value).startswith(f"invalid_request: {field}: ")
    return info.value


def test_validation_errors(cv, vd, base):
    b = cv.prompt_builder()
    err = _error(b, "voice", "unknown speaker 'bob'; available: aiden, dylan, eric", speaker="bob")
    assert "vivian" in str(err)
    _error(b, "voice", "required", speaker=None)
    _error(b, "voice", "required", speaker="  ")
    _error(b, "language", "unknown language 'klingon'; available: auto, chinese, english", speaker="ryan",
           language="klingon")
    _error(b, "language", "unknown language 'sichuan_dialect'", speaker="eric", language="sichuan_dialect")
    _error(b, "input", "non-empty", text="   ", speaker="ryan")
    _error(b, "instructions", "must be a string", speaker="ryan", instruct=3)
    _error(b, "ref_audio", "needs a base checkpoint", speaker="ryan",
           voice_clone=VoiceClonePrompt(speaker_embedding=torch.zeros(64)))
    v = vd.prompt_builder()
    _error(v, "instructions", "required", instruct=None)
    _error(v, "instructions", "required", instruct="")
    _error(v, "voice", "no preset speakers", speaker="ryan", instruct="calm")
    _error(base.prompt_builder(), "ref_audio", "give ref_audio")


def test_speakers_and_languages(cv):
    b = cv.prompt_builder()
    assert b.speakers == ("aiden", "dylan", "eric", "ono_anna", "ryan", "serena", "sohee", "uncle_fu", "vivian")
    assert "auto" in b.languages and not any("dialect" in x for x in b.languages)
    upper = b.build("Hello.", speaker="RYAN", language="ENGLISH")
    lower = b.build("Hello.", speaker="ryan", language="english")
    assert upper == lower
    assert upper.speaker_codec_id == 3061
    assert upper.codec_prefix == (THINK, THINK_BOS, LANG["english"], THINK_EOS)
    assert b.build("Hello.", speaker="ryan").codec_prefix == (NOTHINK, THINK_BOS, THINK_EOS)
    # ISO 639-1 codes, with or without a region, are the languages they name
    for code in ("en", "EN", "en-US", "en_GB"):
        assert b.build("Hello.", speaker="ryan", language=code) == lower, code
    assert b.build("Hello.", speaker="ryan", language="fr").codec_prefix[2] == LANG["french"]
    assert (b.build("你好。", speaker="eric", language="zh-CN")
            == b.build("你好。", speaker="eric", language="chinese"))   # the dialect rule too
    _error(b, "language", "unknown language 'xx'.*ISO 639-1", speaker="ryan", language="xx")
    _error(b, "language", "unknown language 'eng'", speaker="ryan", language="eng")
    assert b.build("Hello.", speaker="ryan", language="").language == "auto"


@pytest.mark.parametrize("speaker, language, expected", [
    ("eric", "chinese", "sichuan_dialect"), ("eric", "auto", "sichuan_dialect"), ("eric", None, "sichuan_dialect"),
    ("eric", "english", "english"), ("Dylan", "Chinese", "beijing_dialect"), ("dylan", "auto", "beijing_dialect"),
    ("dylan", "french", "french"), ("vivian", "chinese", "chinese"), ("vivian", "auto", None),
])
def test_dialect_rule(cv, speaker, language, expected):
    prompt = cv.prompt_builder().build("你好。", speaker=speaker, language=language)
    if expected is None:
        assert prompt.codec_prefix == (NOTHINK, THINK_BOS, THINK_EOS)
    else:
        assert prompt.codec_prefix == (THINK, THINK_BOS, LANG[expected], THINK_EOS)


def test_instructions(cv, cv17, vd):
    # the 0.6B-style custom voice ignores instructions (reference wrapper), the 1.7B-style keeps them
    assert cv.config.ignores_instructions and not cv17.config.ignores_instructions
    assert cv.prompt_builder().build("Hi.", speaker="ryan", instruct="Whisper.").instruct_ids is None
    kept = cv17.prompt_builder().build("Hi.", speaker="ryan", instruct="Whisper.")
    ids = cv17.tokenizer.encode("<|im_start|>user\nWhisper.<|im_end|>\n")
    assert kept.instruct_ids == tuple(ids)
    assert cv17.prompt_builder().build("Hi.", speaker="ryan", instruct="").instruct_ids is None
    assert vd.prompt_builder().build("Hi.", instruct="Calm.").speaker_codec_id is None


def test_text_modes_and_lengths(cv, cv17):
    for ck in (cv, cv17):
        b = ck.prompt_builder()
        default = b.build("Hello world, how are you?", speaker="ryan", language="english", instruct="Loud.")
        assert default.non_streaming_mode is True  # the wrappers' default
        streaming = b.build("Hello world, how are you?", speaker="ryan", language="english", instruct="Loud.",
                            non_streaming_mode=False)
        n_text = len(streaming.text_ids)
        with torch.inference_mode():
            e_default = embed_prompt(ck.talker, ck.config, default)
            e_stream = embed_prompt(ck.talker, ck.config, streaming)
        assert e_default.prefill.shape[1] == default.prefill_length
        assert e_stream.prefill.shape[1] == streaming.prefill_length
        assert e_default.prefill.shape[1] - e_stream.prefill.shape[1] == n_text + 1  # text + tts_eos moved in
        assert e_default.trailing_text.shape[1] == 1                            # tts_pad only
        assert e_stream.trailing_text.shape[1] == n_text                        # text[1:] + tts_eos
        assert torch.equal(e_default.trailing_text, e_default.tts_pad)
