"""Released ``base`` checkpoints write only ``enc_dim`` and ``sample_rate`` in
``speaker_encoder_config`` (custom-voice and voice-design ones have no such key): the rest comes
from the reference's defaults, so their speaker encoder builds in the released shape."""
from __future__ import annotations

import pytest

from omni_backend.models.qwen3_tts.config import SPEAKER_ENCODER_DEFAULTS, Qwen3TTSConfig
from omni_backend.models.qwen3_tts.random_checkpoint import checkpoint_config
from omni_backend.models.qwen3_tts.speaker_encoder import SpeakerEncoder


@pytest.mark.parametrize("size, enc_dim", [("0.6b", 1024), ("1.7b", 2048)])
def test_a_released_base_config_builds_the_released_speaker_encoder(size, enc_dim):
    raw = checkpoint_config(size, "base")
    assert raw["speaker_encoder_config"] == {"enc_dim": enc_dim, "sample_rate": 24000}
    config = Qwen3TTSConfig.from_dict(raw).speaker_encoder
    assert config == {**SPEAKER_ENCODER_DEFAULTS, "enc_dim": enc_dim}
    encoder = SpeakerEncoder(config)
    assert encoder.fc.weight.shape[:2] == (enc_dim, 2 * 1536)
    assert len(encoder.blocks) == 4 and encoder.asp.conv.weight.shape[:2] == (1536, 128)


@pytest.mark.parametrize("kind", ["custom_voice", "voice_design"])
def test_other_checkpoints_carry_no_speaker_encoder_config(kind):
    assert "speaker_encoder_config" not in checkpoint_config("1.7b", kind)


def test_given_values_win_over_the_defaults():
    raw = checkpoint_config("tiny", "base")
    config = Qwen3TTSConfig.from_dict(raw).speaker_encoder
    assert config["enc_channels"] == [32, 32, 32, 32, 96] and config["mel_dim"] == 128
