"""What the Qwen3 families' ``config.json`` readers share: the error that names a key, the
``head_dim`` rule, and the code predictor's settings (``talker_config.code_predictor_config``), whose
defaults are the references' (``Qwen3TTSTalkerCodePredictorConfig``; Qwen3-Omni's are the same).
Each family reads its own layout into them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["ConfigError", "CodePredictorConfig", "read_head_dim"]


class ConfigError(ValueError):
    """A ``config.json`` this implementation cannot serve (the message names the key)."""


def read_head_dim(raw: Mapping[str, Any], hidden: int, heads: int, default: int | None) -> int:
    """``head_dim`` when given (and not 0 / null), else ``default``, else ``hidden // heads``."""
    value = raw.get("head_dim", default)
    return int(value) if value else hidden // heads


@dataclass(frozen=True)
class CodePredictorConfig:
    """The sub-talker ("MTP" module) that predicts codebooks 1..num_code_groups-1 of a frame."""

    vocab_size: int = 2048
    hidden_size: int = 1024
    intermediate_size: int = 3072
    num_hidden_layers: int = 5
    num_attention_heads: int = 16
    num_key_value_heads: int = 8
    head_dim: int = 128
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False
    num_code_groups: int = 32
