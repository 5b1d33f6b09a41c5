"""The talker (``talker.*``): a Qwen3 decoder whose input at each position is the sum of a
text-channel embedding (``text_projection(text_embedding(id))``) and a codec-channel embedding
(``codec_embedding``), and whose ``codec_head`` predicts codebook 0 of the next frame.

The modules hold the checkpoint's tensors; prefill and decode over them are :mod:`.decode`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omni_backend.engine.kv_cache import StaticKVCache

from .code_predictor import CodePredictor
from .config import TalkerConfig
from omni_backend.models.qwen3_common.layers import DecoderLayer, RMSNorm, activation

from .rotary import TalkerRotary

__all__ = ["Talker", "TalkerModel", "TextProjection"]


class TalkerModel(nn.Module):
    """Checkpoint prefix ``talker.model.``."""

    def __init__(self, config: TalkerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList([
            DecoderLayer(config.hidden_size, config.intermediate_size, config.num_attention_heads,
                         config.num_key_value_heads, config.head_dim, config.rms_norm_eps, config.hidden_act,
                         config.attention_bias)
            for _ in range(config.num_hidden_layers)
        ])
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.codec_embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.text_embedding = nn.Embedding(config.text_vocab_size, config.text_hidden_size)


class TextProjection(nn.Module):
    """``linear_fc2(act(linear_fc1(x)))``: text embeddings to the talker's hidden size."""

    def __init__(self, text_hidden_size: int, hidden_size: int, hidden_act: str) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden_size, text_hidden_size, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden_size, hidden_size, bias=True)
        self.act_fn = activation(hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act_fn(self.linear_fc1(x)))


class Talker(nn.Module):
    """Checkpoint prefix ``talker.``."""

    def __init__(self, config: TalkerConfig) -> None:
        super().__init__()
        self.config = config
        self.model = TalkerModel(config)
        self.text_projection = TextProjection(config.text_hidden_size, config.hidden_size, config.hidden_act)
        self.codec_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.code_predictor = CodePredictor(config.code_predictor, config)

    # -- helpers the prompt builder uses
    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        """``text_projection(text_embedding(ids))`` for ids ``[1, n]`` -> ``[1, n, hidden]``.
        The text table may live in host memory (see ``load_checkpoint``): rows are looked up
        where it is and moved to the projection's device."""
        table = self.model.text_embedding.weight
        rows = F.embedding(ids.to(table.device), table)
        return self.text_projection(rows.to(self.text_projection.linear_fc1.weight.device))

    def embed_codec(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.codec_embedding(ids)

    def new_cache(self, num_slots: int, max_len: int, dtype: torch.dtype, device: torch.device) -> StaticKVCache:
        c = self.config
        return StaticKVCache(c.num_hidden_layers, num_slots, c.num_key_value_heads, max_len, c.head_dim, dtype,
                             device)

    def new_rotary(self, dtype: torch.dtype, device: torch.device) -> TalkerRotary:
        c = self.config
        return TalkerRotary(c.rope_theta, c.head_dim, c.mrope_section, c.mrope_interleaved, dtype, device)
