"""The released ``config.json`` of a VoxCPM2 checkpoint, read into plain dataclasses.

The field names are the released ones (``voxcpm`` 2.0.3's ``VoxCPMConfig``); the local encoder and
the diffusion transformer are MiniCPM4 stacks that inherit the backbone's settings and override
width, depth and heads, as the reference builds them.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class RopeScaling:
    type: str
    long_factor: tuple[float, ...]
    short_factor: tuple[float, ...]
    original_max_position_embeddings: int


@dataclass(frozen=True)
class MiniCPM4Config:
    hidden_size: int
    intermediate_size: int
    max_position_embeddings: int
    num_attention_heads: int
    num_hidden_layers: int
    num_key_value_heads: int
    rms_norm_eps: float
    rope_scaling: RopeScaling
    vocab_size: int
    scale_emb: float
    dim_model_base: int
    scale_depth: float
    rope_theta: float
    bos_token_id: int = 1
    eos_token_id: int = 2
    use_mup: bool = True
    kv_channels: int | None = None
    no_rope: bool = False

    @property
    def head_dim(self) -> int:
        return self.kv_channels if self.kv_channels else self.hidden_size // self.num_attention_heads


@dataclass(frozen=True)
class StackConfig:
    """The local encoder's or the diffusion transformer's own width, depth and heads."""
    hidden_dim: int = 1024
    ffn_dim: int = 4096
    num_heads: int = 16
    num_layers: int = 4
    kv_channels: int | None = None


@dataclass(frozen=True)
class CfmConfig:
    sigma_min: float = 1e-6
    solver: str = "euler"
    t_scheduler: str = "log-norm"
    inference_cfg_rate: float = 1.0


@dataclass(frozen=True)
class AudioVAEConfig:
    encoder_dim: int = 128
    encoder_rates: tuple[int, ...] = (2, 5, 8, 8)
    latent_dim: int = 64
    decoder_dim: int = 2048
    decoder_rates: tuple[int, ...] = (8, 6, 5, 2, 2, 2)
    depthwise: bool = True
    sample_rate: int = 16000
    out_sample_rate: int = 48000
    use_noise_block: bool = False
    sr_bin_boundaries: tuple[int, ...] | None = (20000, 30000, 40000)
    cond_type: str = "scale_bias"
    cond_dim: int = 128
    cond_out_layer: bool = False

    @property
    def hop_length(self) -> int:
        """Input samples per latent frame (the encoder's stride)."""
        return math.prod(self.encoder_rates)

    @property
    def decode_hop_length(self) -> int:
        """Output samples per latent frame (the decoder's upsampling)."""
        return math.prod(self.decoder_rates)


@dataclass(frozen=True)
class VoxCPM2Config:
    lm_config: MiniCPM4Config
    encoder_config: StackConfig
    dit_config: StackConfig
    cfm_config: CfmConfig
    audio_vae_config: AudioVAEConfig
    dit_mean_mode: bool = False
    patch_size: int = 4
    feat_dim: int = 64
    residual_lm_num_layers: int = 8
    residual_lm_no_rope: bool = False
    scalar_quantization_latent_dim: int = 512
    scalar_quantization_scale: int = 9
    max_length: int = 8192
    dtype: str = "bfloat16"
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    def residual_lm(self) -> MiniCPM4Config:
        return replace(self.lm_config, num_hidden_layers=self.residual_lm_num_layers, vocab_size=0,
                       no_rope=self.residual_lm_no_rope)

    def _local(self, stack: StackConfig) -> MiniCPM4Config:
        return replace(self.lm_config, hidden_size=stack.hidden_dim, intermediate_size=stack.ffn_dim,
                       num_attention_heads=stack.num_heads, num_hidden_layers=stack.num_layers,
                       kv_channels=stack.kv_channels, vocab_size=0)

    def local_encoder(self) -> MiniCPM4Config:
        return self._local(self.encoder_config)

    def local_dit(self) -> MiniCPM4Config:
        return self._local(self.dit_config)


def _known(cls, data: dict) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items() if k in names}


def parse_config(data: dict) -> VoxCPM2Config:
    # the reference picks its model class by this field, "voxcpm" when absent (VoxCPM 1.x, another
    # architecture: no reference-audio encoder, other VAE): refused here rather than misloaded
    arch = str(data.get("architecture", "voxcpm")).lower()
    if arch != "voxcpm2":
        raise ValueError(f"config.json: architecture is {arch!r}; this pipeline serves VoxCPM2 checkpoints "
                         "(architecture 'voxcpm2')")
    lm = dict(data["lm_config"])
    rope = lm["rope_scaling"]
    lm["rope_scaling"] = RopeScaling(rope["type"], tuple(rope["long_factor"]), tuple(rope["short_factor"]),
                                     int(rope["original_max_position_embeddings"]))
    dit = dict(data.get("dit_config") or {})
    cfm = CfmConfig(**_known(CfmConfig, dit.get("cfm_config") or {}))
    vae = data.get("audio_vae_config")
    top = {k: v for k, v in data.items()
           if k not in ("lm_config", "encoder_config", "dit_config", "audio_vae_config", "raw",
                        "cfm_config", "dit_mean_mode")}
    return VoxCPM2Config(
        lm_config=MiniCPM4Config(**_known(MiniCPM4Config, lm)),
        encoder_config=StackConfig(**_known(StackConfig, data.get("encoder_config") or {})),
        dit_config=StackConfig(**_known(StackConfig, dit)),
        cfm_config=cfm,
        audio_vae_config=AudioVAEConfig(**_known(AudioVAEConfig, vae or {})),
        dit_mean_mode=bool(dit.get("dit_mean_mode", False)),
        raw=data,
        **_known(VoxCPM2Config, top),
    )


def load_config(path: str) -> VoxCPM2Config:
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        return parse_config(json.load(f))
