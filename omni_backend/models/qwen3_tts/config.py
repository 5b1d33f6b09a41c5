"""Configuration of a Qwen3-TTS (12 Hz) checkpoint, read from its ``config.json`` and
``generation_config.json``.

Keys that a ``config.json`` leaves out take the reference package's defaults (its
``Qwen3TTSTalkerConfig`` / ``Qwen3TTSTalkerCodePredictorConfig``), so a checkpoint is read the way
the reference reads it. Bookkeeping keys that ``save_pretrained`` adds are ignored.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from omni_backend.models.qwen3_common.config import CodePredictorConfig, ConfigError, read_head_dim

__all__ = [
    "CodePredictorConfig",
    "TalkerConfig",
    "Qwen3TTSConfig",
    "GenerationDefaults",
    "TTS_MODEL_TYPES",
    "load_config",
    "load_generation_defaults",
]

TTS_MODEL_TYPES = ("custom_voice", "voice_design", "base")


def _code_predictor(raw: Mapping[str, Any]) -> CodePredictorConfig:
    """``talker_config.code_predictor_config`` as the reference ``Qwen3TTSTalkerCodePredictorConfig`` reads it."""
    cls = CodePredictorConfig
    if raw.get("use_sliding_window"):
        raise ConfigError("talker_config.code_predictor_config.use_sliding_window: sliding-window "
                          "attention is not supported")
    rope_scaling = raw.get("rope_scaling")
    if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type", "default")) != "default":
        raise ConfigError("talker_config.code_predictor_config.rope_scaling: only the default RoPE is supported")
    hidden = int(raw.get("hidden_size", cls.hidden_size))
    heads = int(raw.get("num_attention_heads", cls.num_attention_heads))
    kv = raw.get("num_key_value_heads", cls.num_key_value_heads)
    return cls(
        vocab_size=int(raw.get("vocab_size", cls.vocab_size)),
        hidden_size=hidden,
        intermediate_size=int(raw.get("intermediate_size", cls.intermediate_size)),
        num_hidden_layers=int(raw.get("num_hidden_layers", cls.num_hidden_layers)),
        num_attention_heads=heads,
        num_key_value_heads=int(kv if kv is not None else heads),
        head_dim=read_head_dim(raw, hidden, heads, cls.head_dim),
        hidden_act=str(raw.get("hidden_act", cls.hidden_act)),
        rms_norm_eps=float(raw.get("rms_norm_eps", cls.rms_norm_eps)),
        rope_theta=raw.get("rope_theta", cls.rope_theta),
        attention_bias=bool(raw.get("attention_bias", cls.attention_bias)),
        num_code_groups=int(raw.get("num_code_groups", cls.num_code_groups)),
    )


@dataclass(frozen=True)
class TalkerConfig:
    """The talker: a Qwen3 decoder over text + codec embeddings that predicts codebook 0."""

    vocab_size: int = 3072
    hidden_size: int = 1024
    intermediate_size: int = 2048
    num_hidden_layers: int = 20
    num_attention_heads: int = 16
    num_key_value_heads: int = 2
    head_dim: int = 64
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    mrope_section: tuple[int, ...] = (24, 20, 20)
    mrope_interleaved: bool = True
    attention_bias: bool = False
    num_code_groups: int = 32
    text_hidden_size: int = 2048
    text_vocab_size: int = 151936
    codec_eos_token_id: int = 4198
    codec_think_id: int = 4202
    codec_nothink_id: int = 4203
    codec_think_bos_id: int = 4204
    codec_think_eos_id: int = 4205
    codec_pad_id: int = 4196
    codec_bos_id: int = 4197
    spk_id: Mapping[str, int] = field(default_factory=dict)
    spk_is_dialect: Mapping[str, Any] = field(default_factory=dict)
    codec_language_id: Mapping[str, int] = field(default_factory=dict)
    code_predictor: CodePredictorConfig = field(default_factory=CodePredictorConfig)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "TalkerConfig":
        if raw.get("use_sliding_window"):
            raise ConfigError("talker_config.use_sliding_window: sliding-window attention is not supported")
        rope = raw.get("rope_scaling")
        if not rope or "mrope_section" not in rope:
            # the reference indexes rope_scaling["mrope_section"] unconditionally
            raise ConfigError("talker_config.rope_scaling: must give mrope_section and interleaved")
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ConfigError("talker_config.rope_scaling.rope_type: only the default RoPE is supported")
        if "text_vocab_size" not in raw:
            raise ConfigError("talker_config.text_vocab_size: missing")
        hidden = int(raw.get("hidden_size", cls.hidden_size))
        heads = int(raw.get("num_attention_heads", cls.num_attention_heads))
        head_dim = read_head_dim(raw, hidden, heads, None)
        section = tuple(int(s) for s in rope["mrope_section"])
        if sum(section) != head_dim // 2:
            raise ConfigError(f"talker_config.rope_scaling.mrope_section: {list(section)} must sum to "
                              f"head_dim/2 = {head_dim // 2}")
        return cls(
            vocab_size=int(raw.get("vocab_size", cls.vocab_size)),
            hidden_size=hidden,
            intermediate_size=int(raw.get("intermediate_size", cls.intermediate_size)),
            num_hidden_layers=int(raw.get("num_hidden_layers", cls.num_hidden_layers)),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads", cls.num_key_value_heads)),
            head_dim=head_dim,
            hidden_act=str(raw.get("hidden_act", cls.hidden_act)),
            rms_norm_eps=float(raw.get("rms_norm_eps", cls.rms_norm_eps)),
            rope_theta=raw.get("rope_theta", cls.rope_theta),
            mrope_section=section,
            mrope_interleaved=bool(rope.get("interleaved", False)),
            attention_bias=bool(raw.get("attention_bias", cls.attention_bias)),
            num_code_groups=int(raw.get("num_code_groups", cls.num_code_groups)),
            text_hidden_size=int(raw.get("text_hidden_size", cls.text_hidden_size)),
            text_vocab_size=int(raw["text_vocab_size"]),
            codec_eos_token_id=int(raw.get("codec_eos_token_id", cls.codec_eos_token_id)),
            codec_think_id=int(raw.get("codec_think_id", cls.codec_think_id)),
            codec_nothink_id=int(raw.get("codec_nothink_id", cls.codec_nothink_id)),
            codec_think_bos_id=int(raw.get("codec_think_bos_id", cls.codec_think_bos_id)),
            codec_think_eos_id=int(raw.get("codec_think_eos_id", cls.codec_think_eos_id)),
            codec_pad_id=int(raw.get("codec_pad_id", cls.codec_pad_id)),
            codec_bos_id=int(raw.get("codec_bos_id", cls.codec_bos_id)),
            spk_id=dict(raw.get("spk_id") or {}),
            spk_is_dialect=dict(raw.get("spk_is_dialect") or {}),
            codec_language_id=dict(raw.get("codec_language_id") or {}),
            code_predictor=_code_predictor(raw.get("code_predictor_config") or {}),
        )

    @property
    def has_mtp_projection(self) -> bool:
        """Whether the code predictor projects talker-sized inputs (``small_to_mtp_projection``)."""
        return self.code_predictor.hidden_size != self.hidden_size

    @property
    def suppressed_codec_ids(self) -> tuple[int, ...]:
        """Ids the talker may never emit: the top 1024 of its vocabulary except eos."""
        return tuple(i for i in range(self.vocab_size - 1024, self.vocab_size) if i != self.codec_eos_token_id)


# The reference's Qwen3TTSSpeakerEncoderConfig defaults: released base checkpoints write only
# ``enc_dim`` and ``sample_rate`` and leave the rest to them.
SPEAKER_ENCODER_DEFAULTS: Mapping[str, Any] = {
    "mel_dim": 128, "enc_dim": 1024, "enc_channels": [512, 512, 512, 512, 1536],
    "enc_kernel_sizes": [5, 3, 3, 3, 1], "enc_dilations": [1, 2, 3, 4, 1], "enc_attention_channels": 128,
    "enc_res2net_scale": 8, "enc_se_channels": 128, "sample_rate": 24000,
}


@dataclass(frozen=True)
class Qwen3TTSConfig:
    talker: TalkerConfig
    tts_model_type: str
    tts_model_size: str | None
    tokenizer_type: str | None = None
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    tts_pad_token_id: int = 151671
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673
    # The transformers version that wrote config.json: it decides how the reference loads the
    # text tokenizer (see qwen3_common/tokenizer.py).
    transformers_version: str | None = None
    speaker_encoder: Mapping[str, Any] = field(default_factory=dict)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "Qwen3TTSConfig":
        if raw.get("model_type") not in (None, "qwen3_tts"):
            raise ConfigError(f"model_type: expected 'qwen3_tts', got {raw.get('model_type')!r}")
        kind = raw.get("tts_model_type")
        if kind not in TTS_MODEL_TYPES:
            raise ConfigError(f"tts_model_type: expected one of {', '.join(TTS_MODEL_TYPES)}, got {kind!r}")
        return cls(
            talker=TalkerConfig.from_dict(raw.get("talker_config") or {}),
            tts_model_type=kind,
            tts_model_size=raw.get("tts_model_size"),
            tokenizer_type=raw.get("tokenizer_type"),
            im_start_token_id=int(raw.get("im_start_token_id", 151644)),
            im_end_token_id=int(raw.get("im_end_token_id", 151645)),
            tts_pad_token_id=int(raw.get("tts_pad_token_id", 151671)),
            tts_bos_token_id=int(raw.get("tts_bos_token_id", 151672)),
            tts_eos_token_id=int(raw.get("tts_eos_token_id", 151673)),
            transformers_version=raw.get("transformers_version"),
            speaker_encoder={**SPEAKER_ENCODER_DEFAULTS, **(raw.get("speaker_encoder_config") or {})},
            raw=raw,
        )

    @property
    def speakers(self) -> tuple[str, ...]:
        """Preset speaker names (lower case), sorted."""
        return tuple(sorted(str(s).lower() for s in self.talker.spk_id))

    @property
    def languages(self) -> tuple[str, ...]:
        """Languages a request may name: ``auto`` plus every codec language that is not a dialect
        (dialects are chosen through the speaker, as in the reference)."""
        return ("auto",) + tuple(sorted(k for k in self.talker.codec_language_id if "dialect" not in k))

    @property
    def ignores_instructions(self) -> bool:
        """The reference's CustomVoice wrapper drops instructions for the 0.6B model; its test is
        ``tts_model_size in "0b6"`` (a substring test, reproduced as is)."""
        size = self.tts_model_size
        return self.tts_model_type == "custom_voice" and isinstance(size, str) and size in "0b6"


@dataclass(frozen=True)
class GenerationDefaults:
    """``generation_config.json`` of the checkpoint, with the reference wrapper's fallbacks."""

    do_sample: bool = True
    top_k: int = 50
    top_p: float = 1.0
    temperature: float = 0.9
    repetition_penalty: float = 1.05
    subtalker_dosample: bool = True
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    subtalker_temperature: float = 0.9
    max_new_tokens: int = 2048

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "GenerationDefaults":
        values = {}
        for name in cls.__dataclass_fields__:
            if name in raw and raw[name] is not None:
                values[name] = type(getattr(cls, name))(raw[name])
        return cls(**values)


def _read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def load_config(checkpoint_dir: str) -> Qwen3TTSConfig:
    path = os.path.join(checkpoint_dir, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{checkpoint_dir}: no config.json (not a Qwen3-TTS checkpoint folder)")
    return Qwen3TTSConfig.from_dict(_read_json(path))


def load_generation_defaults(checkpoint_dir: str) -> GenerationDefaults:
    path = os.path.join(checkpoint_dir, "generation_config.json")
    return GenerationDefaults.from_dict(_read_json(path) if os.path.isfile(path) else {})
