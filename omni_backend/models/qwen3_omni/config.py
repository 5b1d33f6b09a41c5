"""Configuration of a Qwen3-Omni checkpoint (``Qwen3-Omni-30B-A3B-Instruct`` layout), read from its
``config.json``.

Parsed: the thinker's text model (``thinker_config.text_config``), its audio encoder
(``thinker_config.audio_config``) and media token ids, the talker (``talker_config``: its MoE text
model, the code predictor, codec and speaker ids), ``code2wav_config`` and the top-level chat / TTS
token ids, and its vision encoder (``thinker_config.vision_config``).

A checkpoint with ``enable_audio_output: false`` (the released Thinking and Captioner ones) has no
talker or code2wav weights: its talker section is not read (``talker`` is None) and it answers in
text only.

Two spellings of the rotary settings are read: the released one (``rope_theta`` plus
``rope_scaling`` with ``mrope_section``), and the one transformers 5 writes (``rope_parameters``).
A key this implementation needs and cannot default (a section, a size that fixes tensor shapes)
is a :class:`ConfigError` naming it; keys that are left out otherwise take the reference's
defaults (transformers' ``Qwen3OmniMoe*Config``), and unknown keys are ignored.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from omni_backend.models.qwen3_common.config import CodePredictorConfig, ConfigError

__all__ = [
    "ConfigError",
    "MoeTextConfig",
    "CodePredictorConfig",
    "TalkerConfig",
    "Code2WavConfig",
    "AudioTowerConfig",
    "VisionConfig",
    "Qwen3OmniConfig",
    "SPEECHLESS",
    "load_config",
]

SPEECHLESS = ("this checkpoint does not speak (config.json: enable_audio_output is false, as in the Thinking "
              "and Captioner checkpoints)")


def _section(raw: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    value = raw.get(key)
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}{key}: missing (a Qwen3-Omni config.json has this section)")
    return value


def _require(raw: Mapping[str, Any], key: str, where: str) -> Any:
    if raw.get(key) is None:
        raise ConfigError(f"{where}{key}: missing")
    return raw[key]


def _rope(raw: Mapping[str, Any], where: str, default_theta: float,
          multimodal: bool) -> tuple[float, tuple[int, ...]]:
    """``(rope_theta, mrope_section)`` from ``rope_parameters`` (transformers 5) or ``rope_theta`` +
    ``rope_scaling`` (the released files). Only the default RoPE type is supported."""
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    merged = {**scaling, **params}
    kind = merged.get("rope_type", merged.get("type", "default"))
    if kind != "default":
        raise ConfigError(f"{where}rope_parameters.rope_type: only the default RoPE is supported, got {kind!r}")
    theta = float(merged.get("rope_theta", raw.get("rope_theta", default_theta)))
    section: tuple[int, ...] = ()
    if multimodal:
        # the reference falls back to [24, 20, 20] when the section is missing
        section = tuple(int(s) for s in merged.get("mrope_section", (24, 20, 20)))
        if len(section) != 3:
            raise ConfigError(f"{where}rope_parameters.mrope_section: expected 3 sizes, got {list(section)}")
    return theta, section


@dataclass(frozen=True)
class MoeTextConfig:
    """A Qwen3-MoE decoder: the thinker's text model, or the talker's (with a shared expert)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_act: str
    rms_norm_eps: float
    rope_theta: float
    mrope_section: tuple[int, ...]
    attention_bias: bool
    moe_intermediate_size: int
    num_experts: int
    num_experts_per_tok: int
    norm_topk_prob: bool
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    shared_expert_intermediate_size: int = 0  # talker only; 0: no shared expert
    all_layers_sparse: bool = False  # talker: every layer is a sparse MoE block (see from_dict)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str, defaults: Mapping[str, Any],
                  talker: bool = False) -> "MoeTextConfig":
        # sliding_window is ignored, as the reference's thinker and talker attention ignores it
        hidden = int(_require(raw, "hidden_size", where))
        heads = int(_require(raw, "num_attention_heads", where))
        kv = raw.get("num_key_value_heads")
        head_dim = int(raw.get("head_dim") or hidden // heads)
        theta, section = _rope(raw, where, defaults["rope_theta"], multimodal=True)
        if sum(section) != head_dim // 2:
            raise ConfigError(f"{where}rope_parameters.mrope_section: {list(section)} must sum to "
                              f"head_dim/2 = {head_dim // 2}")
        # transformers' talker text config maps num_experts to num_local_experts, and save_pretrained
        # writes the latter
        experts = raw.get("num_experts", raw.get("num_local_experts", defaults["num_experts"]))
        shared = 0
        if talker:
            shared = int(_require(raw, "shared_expert_intermediate_size", where))
        heads_kv = int(kv) if kv is not None else heads
        if heads % heads_kv:
            raise ConfigError(f"{where}num_key_value_heads: {heads_kv} does not divide num_attention_heads {heads}")
        return cls(
            vocab_size=int(_require(raw, "vocab_size", where)),
            hidden_size=hidden,
            intermediate_size=int(raw.get("intermediate_size", defaults["intermediate_size"])),
            num_hidden_layers=int(_require(raw, "num_hidden_layers", where)),
            num_attention_heads=heads,
            num_key_value_heads=heads_kv,
            head_dim=head_dim,
            hidden_act=str(raw.get("hidden_act", "silu")),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            mrope_section=section,
            attention_bias=bool(raw.get("attention_bias", False)),
            moe_intermediate_size=int(raw.get("moe_intermediate_size", defaults["moe_intermediate_size"])),
            num_experts=int(experts),
            num_experts_per_tok=int(raw.get("num_experts_per_tok", 8)),
            norm_topk_prob=bool(raw.get("norm_topk_prob", defaults["norm_topk_prob"])),
            decoder_sparse_step=int(raw.get("decoder_sparse_step", 1)),
            mlp_only_layers=tuple(int(i) for i in (raw.get("mlp_only_layers") or ())),
            shared_expert_intermediate_size=shared,
            # the reference's talker layer replaces whatever MLP it chose with the shared-expert MoE
            # block, whatever decoder_sparse_step and mlp_only_layers say
            all_layers_sparse=talker,
        )

    def is_sparse(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` has a sparse MoE block (else a dense MLP)."""
        if self.all_layers_sparse:
            return True
        return (layer not in self.mlp_only_layers and self.num_experts > 0
                and (layer + 1) % self.decoder_sparse_step == 0)


_THINKER_DEFAULTS = {"rope_theta": 1000000.0, "num_experts": 128, "moe_intermediate_size": 768,
                     "norm_topk_prob": True, "intermediate_size": 18944}
_TALKER_DEFAULTS = {"rope_theta": 1000000.0, "num_experts": 128, "moe_intermediate_size": 384,
                    "norm_topk_prob": False, "intermediate_size": 2048}


def _code_predictor(raw: Mapping[str, Any], where: str, num_code_groups: int) -> CodePredictorConfig:
    d = CodePredictorConfig
    layers = int(raw.get("num_hidden_layers", d.num_hidden_layers))
    # the reference makes layers from max_window_layers on sliding-window layers
    if raw.get("sliding_window") is not None and layers > int(raw.get("max_window_layers", 28)):
        raise ConfigError(f"{where}sliding_window: sliding-window attention is not supported")
    hidden = int(raw.get("hidden_size", d.hidden_size))
    heads = int(raw.get("num_attention_heads", d.num_attention_heads))
    kv = raw.get("num_key_value_heads")
    theta, _ = _rope(raw, where, 10000.0, multimodal=False)
    groups = int(raw.get("num_code_groups", num_code_groups))
    if groups != num_code_groups:
        raise ConfigError(f"{where}num_code_groups: {groups}, but talker_config.num_code_groups is {num_code_groups}")
    return CodePredictorConfig(
        vocab_size=int(raw.get("vocab_size", d.vocab_size)),
        hidden_size=hidden,
        intermediate_size=int(raw.get("intermediate_size", d.intermediate_size)),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=int(kv) if kv is not None else heads,
        head_dim=int(raw.get("head_dim") or d.head_dim),
        hidden_act=str(raw.get("hidden_act", d.hidden_act)),
        rms_norm_eps=float(raw.get("rms_norm_eps", d.rms_norm_eps)),
        rope_theta=theta,
        attention_bias=bool(raw.get("attention_bias", d.attention_bias)),
        num_code_groups=groups,
    )


@dataclass(frozen=True)
class TalkerConfig:
    text: MoeTextConfig
    code_predictor: CodePredictorConfig
    num_code_groups: int
    thinker_hidden_size: int
    accept_hidden_layer: int
    speaker_id: Mapping[str, int]
    codec_eos_token_id: int = 4198
    codec_nothink_id: int = 4203
    codec_think_bos_id: int = 4204
    codec_think_eos_id: int = 4205
    codec_pad_id: int = 4196
    codec_bos_id: int = 4197

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "TalkerConfig":
        where = "talker_config."
        text = MoeTextConfig.from_dict(_section(raw, "text_config", where), where + "text_config.",
                                       _TALKER_DEFAULTS, talker=True)
        groups = int(raw.get("num_code_groups", 32))
        predictor = _code_predictor(raw.get("code_predictor_config") or {}, where + "code_predictor_config.",
                                    groups)
        if predictor.hidden_size != text.hidden_size:
            # the reference feeds the talker's hidden state to the code predictor unprojected
            raise ConfigError(f"{where}code_predictor_config.hidden_size: {predictor.hidden_size} must equal "
                              f"text_config.hidden_size {text.hidden_size}")
        speakers = raw.get("speaker_id")
        if not isinstance(speakers, Mapping) or not speakers:
            raise ConfigError(f"{where}speaker_id: missing (the speaker name -> codec id table)")
        return cls(
            text=text,
            code_predictor=predictor,
            num_code_groups=groups,
            thinker_hidden_size=int(_require(raw, "thinker_hidden_size", where)),
            accept_hidden_layer=int(raw.get("accept_hidden_layer", 18)),
            speaker_id={str(k).lower(): int(v) for k, v in speakers.items()},
            codec_eos_token_id=int(raw.get("codec_eos_token_id", 4198)),
            codec_nothink_id=int(raw.get("codec_nothink_id", 4203)),
            codec_think_bos_id=int(raw.get("codec_think_bos_id", 4204)),
            codec_think_eos_id=int(raw.get("codec_think_eos_id", 4205)),
            codec_pad_id=int(raw.get("codec_pad_id", 4196)),
            codec_bos_id=int(raw.get("codec_bos_id", 4197)),
        )

    @property
    def suppressed_codec_ids(self) -> tuple[int, ...]:
        """What the reference ``generate`` suppresses: the last 1024 codec ids except codec eos."""
        vocab = self.text.vocab_size
        return tuple(i for i in range(vocab - 1024, vocab) if i != self.codec_eos_token_id)

    @property
    def speakers(self) -> tuple[str, ...]:
        return tuple(sorted(self.speaker_id))


@dataclass(frozen=True)
class Code2WavConfig:
    """``code2wav_config``; defaults are the reference's ``Qwen3OmniMoeCode2WavConfig``."""

    codebook_size: int = 2048
    hidden_size: int = 1024
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 64
    attention_bias: bool = False
    sliding_window: int = 72
    intermediate_size: int = 3072
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    num_hidden_layers: int = 8
    num_quantizers: int = 16
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    decoder_dim: int = 1536
    sample_rate: int = 24000

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "Code2WavConfig":
        where = "code2wav_config."
        d = cls
        hidden = int(raw.get("hidden_size", d.hidden_size))
        heads = int(raw.get("num_attention_heads", d.num_attention_heads))
        theta, _ = _rope(raw, where, d.rope_theta, multimodal=False)
        decoder_dim = int(raw.get("decoder_dim", d.decoder_dim))
        rates = tuple(int(r) for r in raw.get("upsample_rates", d.upsample_rates))
        if decoder_dim % (2 ** len(rates)):
            raise ConfigError(f"{where}decoder_dim: {decoder_dim} is not divisible by 2 ** len(upsample_rates)")
        kv = raw.get("num_key_value_heads")
        return cls(
            codebook_size=int(raw.get("codebook_size", d.codebook_size)),
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=int(kv) if kv is not None else d.num_key_value_heads,
            head_dim=int(raw.get("head_dim") or hidden // heads),
            attention_bias=bool(raw.get("attention_bias", d.attention_bias)),
            sliding_window=int(raw.get("sliding_window", d.sliding_window)),
            intermediate_size=int(raw.get("intermediate_size", d.intermediate_size)),
            hidden_act=str(raw.get("hidden_act", d.hidden_act)),
            rms_norm_eps=float(raw.get("rms_norm_eps", d.rms_norm_eps)),
            rope_theta=theta,
            num_hidden_layers=int(raw.get("num_hidden_layers", d.num_hidden_layers)),
            num_quantizers=int(raw.get("num_quantizers", d.num_quantizers)),
            upsample_rates=rates,
            upsampling_ratios=tuple(int(r) for r in raw.get("upsampling_ratios", d.upsampling_ratios)),
            decoder_dim=decoder_dim,
        )

    @property
    def hop_length(self) -> int:
        """Samples per codec frame before the reference's per-decode trim (1920 at 12.5 Hz)."""
        product = 1
        for r in self.upsample_rates + self.upsampling_ratios:
            product *= r
        return product


@dataclass(frozen=True)
class AudioTowerConfig:
    """``thinker_config.audio_config``; defaults are the reference's ``Qwen3OmniMoeAudioEncoderConfig``."""

    num_mel_bins: int = 128
    d_model: int = 1280
    encoder_layers: int = 32
    encoder_attention_heads: int = 20
    encoder_ffn_dim: int = 5120
    activation_function: str = "gelu"
    max_source_positions: int = 1500
    scale_embedding: bool = False
    n_window: int = 50
    n_window_infer: int = 800
    conv_chunksize: int = 500
    downsample_hidden_size: int = 480
    output_dim: int = 3584

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "AudioTowerConfig":
        where = "thinker_config.audio_config."
        d = cls
        values = {name: type(getattr(d, name))(raw.get(name, getattr(d, name))) for name in (
            "num_mel_bins", "d_model", "encoder_layers", "encoder_attention_heads", "encoder_ffn_dim",
            "activation_function", "max_source_positions", "scale_embedding", "n_window", "n_window_infer",
            "conv_chunksize", "downsample_hidden_size", "output_dim")}
        config = cls(**values)
        if config.d_model % config.encoder_attention_heads:
            raise ConfigError(f"{where}encoder_attention_heads: {config.encoder_attention_heads} does not divide "
                              f"d_model {config.d_model}")
        if config.d_model % 2:
            raise ConfigError(f"{where}d_model: {config.d_model} must be even (sinusoid positions)")
        if config.n_window < 1 or config.n_window_infer < 2 * config.n_window:
            raise ConfigError(f"{where}n_window_infer: {config.n_window_infer} must be at least 2 * n_window "
                              f"({2 * config.n_window})")
        return config

    @property
    def chunk_frames(self) -> int:
        """Mel frames per encoder chunk (``n_window * 2``)."""
        return self.n_window * 2

    def output_length(self, mel_frames: int) -> int:
        """Audio tokens (placeholders) for ``mel_frames`` feature frames: three stride-2 convolutions
        per ``n_window * 2``-frame chunk (13 tokens per full chunk of 100), as the reference counts."""
        chunk = self.chunk_frames
        leave = mel_frames % chunk
        lengths = (leave - 1) // 2 + 1
        return ((lengths - 1) // 2 + 1 - 1) // 2 + 1 + (mel_frames // chunk) * 13


@dataclass(frozen=True)
class VisionConfig:
    """``thinker_config.vision_config``; defaults are the reference's ``Qwen3OmniMoeVisionEncoderConfig``."""

    depth: int = 27
    hidden_size: int = 1152
    hidden_act: str = "gelu_pytorch_tanh"
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    out_hidden_size: int = 3584
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
    rope_theta: float = 10000.0

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "VisionConfig":
        where = "thinker_config.vision_config."
        d = cls
        scalars = {name: type(getattr(d, name))(raw.get(name, getattr(d, name))) for name in (
            "depth", "hidden_size", "hidden_act", "intermediate_size", "num_heads", "in_channels", "patch_size",
            "spatial_merge_size", "temporal_patch_size", "out_hidden_size", "num_position_embeddings")}
        theta = float((raw.get("rope_parameters") or {}).get("rope_theta", raw.get("rope_theta", d.rope_theta)))
        config = cls(**scalars, rope_theta=theta,
                     deepstack_visual_indexes=tuple(int(i) for i in raw.get("deepstack_visual_indexes",
                                                                            d.deepstack_visual_indexes)))
        if config.hidden_size % config.num_heads or (config.hidden_size // config.num_heads) % 4:
            raise ConfigError(f"{where}num_heads: {config.num_heads} must divide hidden_size {config.hidden_size} "
                              "into heads of a multiple of 4 (2-D rotary)")
        side = int(config.num_position_embeddings ** 0.5)
        if side * side != config.num_position_embeddings:
            raise ConfigError(f"{where}num_position_embeddings: {config.num_position_embeddings} is not a square")
        if any(not 0 <= i < config.depth for i in config.deepstack_visual_indexes):
            raise ConfigError(f"{where}deepstack_visual_indexes: {list(config.deepstack_visual_indexes)} are not "
                              f"blocks 0..{config.depth - 1}")
        if config.hidden_act not in ("gelu_pytorch_tanh", "gelu"):
            raise ConfigError(f"{where}hidden_act: {config.hidden_act!r} is not supported")
        return config


@dataclass(frozen=True)
class Qwen3OmniConfig:
    thinker: MoeTextConfig
    talker: TalkerConfig | None   # None: the checkpoint does not speak (enable_audio_output: false)
    code2wav: Code2WavConfig
    enable_audio_output: bool = True
    im_start_token_id: int = 151644
    im_end_token_id: int = 151645
    tts_pad_token_id: int = 151671
    tts_bos_token_id: int = 151672
    tts_eos_token_id: int = 151673
    system_token_id: int = 8948
    user_token_id: int = 872
    assistant_token_id: int = 77091
    # thinker_config's multimodal placeholders: the talker reads the thinker's hidden states there
    audio_token_id: int = 151646
    image_token_id: int = 151655
    video_token_id: int = 151656
    audio_start_token_id: int = 151669
    audio_end_token_id: int = 151670
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653
    audio: AudioTowerConfig | None = None   # None: the checkpoint config has no audio encoder
    vision: VisionConfig | None = None      # None: no vision encoder
    position_id_per_seconds: float = 13.0   # the thinker's temporal positions per second of media
    talker_position_id_per_seconds: float = 25.0
    transformers_version: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "Qwen3OmniConfig":
        if raw.get("model_type") not in (None, "qwen3_omni_moe"):
            raise ConfigError(f"model_type: expected 'qwen3_omni_moe', got {raw.get('model_type')!r}")
        thinker_raw = _section(raw, "thinker_config", "")
        thinker = MoeTextConfig.from_dict(_section(thinker_raw, "text_config", "thinker_config."),
                                          "thinker_config.text_config.", _THINKER_DEFAULTS)
        speaks = raw.get("enable_audio_output", True)
        if not isinstance(speaks, bool):
            raise ConfigError(f"enable_audio_output: must be true or false, got {speaks!r}")
        talker = TalkerConfig.from_dict(_section(raw, "talker_config", "")) if speaks else None
        if talker is not None and talker.thinker_hidden_size != thinker.hidden_size:
            raise ConfigError(f"talker_config.thinker_hidden_size: {talker.thinker_hidden_size} differs from "
                              f"thinker_config.text_config.hidden_size {thinker.hidden_size}")
        if talker is not None and not 0 <= talker.accept_hidden_layer <= thinker.num_hidden_layers:
            raise ConfigError(f"talker_config.accept_hidden_layer: {talker.accept_hidden_layer} is not a thinker "
                              f"hidden state (0..{thinker.num_hidden_layers})")
        ids = {}
        for name, default in (("im_start_token_id", 151644), ("im_end_token_id", 151645),
                              ("tts_pad_token_id", 151671), ("tts_bos_token_id", 151672),
                              ("tts_eos_token_id", 151673), ("system_token_id", 8948), ("user_token_id", 872),
                              ("assistant_token_id", 77091)):
            ids[name] = int(raw.get(name, default))
        for name, default in (("audio_token_id", 151646), ("image_token_id", 151655),
                              ("video_token_id", 151656), ("audio_start_token_id", 151669),
                              ("audio_end_token_id", 151670), ("vision_start_token_id", 151652),
                              ("vision_end_token_id", 151653)):
            ids[name] = int(thinker_raw.get(name, default))
        audio_raw = thinker_raw.get("audio_config")
        audio = AudioTowerConfig.from_dict(audio_raw) if isinstance(audio_raw, Mapping) else None
        vision_raw = thinker_raw.get("vision_config")
        vision = VisionConfig.from_dict(vision_raw) if isinstance(vision_raw, Mapping) else None
        if vision is not None and vision.out_hidden_size != thinker.hidden_size:
            raise ConfigError(f"thinker_config.vision_config.out_hidden_size: {vision.out_hidden_size} differs from "
                              f"the thinker's hidden_size {thinker.hidden_size}")
        if vision is not None and len(vision.deepstack_visual_indexes) > thinker.num_hidden_layers:
            raise ConfigError("thinker_config.vision_config.deepstack_visual_indexes: more than the thinker's layers")
        if audio is not None and audio.output_dim != thinker.hidden_size:
            raise ConfigError(f"thinker_config.audio_config.output_dim: {audio.output_dim} differs from the "
                              f"thinker's hidden_size {thinker.hidden_size} (audio features replace token embeddings)")
        return cls(
            thinker=thinker,
            talker=talker,
            code2wav=Code2WavConfig.from_dict(raw.get("code2wav_config") or {}),
            audio=audio,
            vision=vision,
            position_id_per_seconds=float(thinker_raw.get("position_id_per_seconds", 25)),
            talker_position_id_per_seconds=float((raw.get("talker_config") or {}).get("position_id_per_seconds", 25)),
            enable_audio_output=speaks,
            transformers_version=raw.get("transformers_version"),
            raw=raw,
            **ids,
        )

    @property
    def multimodal_token_ids(self) -> tuple[int, int, int]:
        return self.audio_token_id, self.image_token_id, self.video_token_id


def load_config(checkpoint_dir: str) -> Qwen3OmniConfig:
    path = os.path.join(checkpoint_dir, "config.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{checkpoint_dir}: no config.json (not a Qwen3-Omni checkpoint folder)")
    with open(path, encoding="utf-8") as handle:
        return Qwen3OmniConfig.from_dict(json.load(handle))
