"""The local encoder (``feat_encoder``): a patch of latents -> one backbone input embedding, read
from a learned special token prepended to the patch (bidirectional MiniCPM4)."""
from __future__ import annotations

import torch
from torch import nn

from .config import MiniCPM4Config
from .minicpm import MiniCPMModel


class LocalEncoder(nn.Module):
    def __init__(self, config: MiniCPM4Config, input_dim: int):
        super().__init__()
        self.special_token = nn.Parameter(torch.zeros(1, 1, 1, config.hidden_size))
        self.in_proj = nn.Linear(input_dim, config.hidden_size, bias=True)
        self.encoder = MiniCPMModel(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, P, D] -> [B, T, hidden]."""
        b, t, p, _ = x.shape
        x = self.in_proj(x)
        x = torch.cat([self.special_token.expand(b, t, 1, -1), x], dim=2).reshape(b * t, p + 1, -1)
        out, _ = self.encoder(x, is_causal=False)
        return out[:, 0, :].reshape(b, t, -1)
