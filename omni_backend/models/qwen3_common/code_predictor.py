"""The code predictor's decoder (checkpoint prefix ``talker.code_predictor.model.``): a small dense
Qwen3 decoder and one codec embedding table per residual codebook, under the same keys in
Qwen3-TTS and Qwen3-Omni checkpoints. Each family wraps it with its ``lm_head`` and its own
arithmetic (its reference's shapes)."""
from __future__ import annotations

from torch import nn

from .config import CodePredictorConfig
from .layers import DecoderLayer, RMSNorm

__all__ = ["CodePredictorModel"]


class CodePredictorModel(nn.Module):
    """Checkpoint prefix ``talker.code_predictor.model.``."""

    def __init__(self, config: CodePredictorConfig, embedding_dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([
            DecoderLayer(config.hidden_size, config.intermediate_size, config.num_attention_heads,
                         config.num_key_value_heads, config.head_dim, config.rms_norm_eps, config.hidden_act,
                         config.attention_bias)
            for _ in range(config.num_hidden_layers)
        ])
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.codec_embedding = nn.ModuleList(
            [nn.Embedding(config.vocab_size, embedding_dim) for _ in range(config.num_code_groups - 1)])
