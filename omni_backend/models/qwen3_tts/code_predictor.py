"""The code predictor ("sub-talker", ``talker.code_predictor.*``): a small Qwen3 decoder that,
for each frame, predicts codebooks 1..15 from the talker's last hidden state and codebook 0.

Per frame it runs a 2-token prefill ``[talker hidden, embedding(cb0)]`` into a fresh cache, then
14 single-token steps; step ``i`` embeds codebook ``i`` with ``codec_embedding[i-1]`` and
predicts codebook ``i+1`` with ``lm_head[i]``. Inputs are talker-sized and go through
``small_to_mtp_projection`` when the two hidden sizes differ (1.7B).

A whole batch of frames (one per running request) advances together: every row is at the same
position, so each row's cache lives in row ``b`` of a small static cache. The modules hold the
checkpoint's tensors; the arithmetic is :meth:`.decode.Qwen3Decode.complete_frame`.
"""
from __future__ import annotations

import torch
from torch import nn

from omni_backend.engine.kv_cache import StaticKVCache

from omni_backend.models.qwen3_common.code_predictor import CodePredictorModel

from .config import CodePredictorConfig, TalkerConfig
from .rotary import CodePredictorRotary

__all__ = ["CodePredictor"]


class CodePredictor(nn.Module):
    """Checkpoint prefix ``talker.code_predictor.``."""

    def __init__(self, config: CodePredictorConfig, talker_config: TalkerConfig) -> None:
        super().__init__()
        self.config = config
        self.model = CodePredictorModel(config, talker_config.hidden_size)
        self.lm_head = nn.ModuleList(
            [nn.Linear(config.hidden_size, config.vocab_size, bias=False) for _ in range(config.num_code_groups - 1)])
        if config.hidden_size != talker_config.hidden_size:
            self.small_to_mtp_projection = nn.Linear(talker_config.hidden_size, config.hidden_size, bias=True)
        else:
            self.small_to_mtp_projection = None

    @property
    def num_steps(self) -> int:
        """Codebooks predicted per frame (15)."""
        return self.config.num_code_groups - 1

    def new_cache(self, max_rows: int, dtype: torch.dtype, device: torch.device) -> StaticKVCache:
        return StaticKVCache(len(self.model.layers), max_rows, self.config.num_key_value_heads,
                             self.config.num_code_groups, self.config.head_dim, dtype, device)

    def new_rotary(self, dtype: torch.dtype, device: torch.device) -> CodePredictorRotary:
        return CodePredictorRotary(self.config.rope_theta, self.config.head_dim, self.num_steps, dtype, device)

    def embed_codes(self, codes: torch.Tensor) -> list[torch.Tensor]:
        """Embeddings ``[B, 1, talker_hidden]`` of codebooks 1..15 (``codes`` ``[B, 15]``)."""
        return [self.model.codec_embedding[i](codes[:, i:i + 1]) for i in range(self.num_steps)]
