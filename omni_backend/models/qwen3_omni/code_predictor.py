"""The talker's code predictor (checkpoint prefix ``talker.code_predictor.``): a small dense Qwen3
decoder that completes each frame's residual codebooks 1..G-1 from the talker's last hidden state
and the frame's codebook 0.

Its tensors are Qwen3-TTS's code predictor's under the same keys (``model.layers``,
``model.norm``, ``model.codec_embedding.{i}``, ``lm_head.{i}``): ``model`` is the shared
:class:`~omni_backend.models.qwen3_common.code_predictor.CodePredictorModel`; here
the embeddings are the predictor's own hidden size (equal to the talker's, checked by the config)
and there is no ``small_to_mtp_projection``.

Per frame (the reference's ``code_predictor.generate``): a 2-token prefill
``[talker hidden, embedding(codebook 0)]`` at positions 0..1 predicts codebook 1 with
``lm_head[0]``; step ``s`` (1..G-2) embeds codebook ``s`` with ``codec_embedding[s-1]`` and
predicts codebook ``s+1`` with ``lm_head[s]``.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from omni_backend.models.qwen3_common.code_predictor import CodePredictorModel

from .config import CodePredictorConfig
from .layers import KVCache, PlainRotary, attention_forward, mlp_forward, rms_norm

__all__ = ["CodePredictor", "Choose"]

# choose(step, float32 logits [B, vocab]) -> ids [B]; step 0 picks codebook 1
Choose = Callable[[int, torch.Tensor], torch.Tensor]


class CodePredictor(nn.Module):
    """Checkpoint prefix ``talker.code_predictor.``."""

    def __init__(self, config: CodePredictorConfig) -> None:
        super().__init__()
        self.config = config
        self.model = CodePredictorModel(config, config.hidden_size)
        self.lm_head = nn.ModuleList(
            [nn.Linear(config.hidden_size, config.vocab_size, bias=False) for _ in range(config.num_code_groups - 1)])
        self._rotary: PlainRotary | None = None

    @property
    def num_steps(self) -> int:
        """Residual codebooks per frame (G - 1)."""
        return self.config.num_code_groups - 1

    @property
    def rotary(self) -> PlainRotary:
        if self._rotary is None:
            self._rotary = PlainRotary(self.config.rope_theta, self.config.head_dim, self.lm_head[0].weight.device)
        return self._rotary

    def _forward(self, embeds: torch.Tensor, cache: KVCache, step: int) -> torch.Tensor:
        start = cache.length
        positions = torch.arange(start, start + embeds.shape[1], device=embeds.device).unsqueeze(0)
        cos, sin = self.rotary(positions, embeds.dtype)
        hidden = embeds
        for index, layer in enumerate(self.model.layers):
            norm = layer.input_layernorm
            hidden = hidden + attention_forward(layer.self_attn, rms_norm(hidden, norm.weight, norm.variance_epsilon),
                                                cos, sin, cache, index)
            norm = layer.post_attention_layernorm
            hidden = hidden + mlp_forward(layer.mlp, rms_norm(hidden, norm.weight, norm.variance_epsilon))
        norm = self.model.norm
        hidden = rms_norm(hidden, norm.weight, norm.variance_epsilon)
        # the reference projects every position, then keeps the last
        return self.lm_head[step](hidden)[:, -1].to(torch.float32)

    def predict(self, talker_hidden: torch.Tensor, first_embed: torch.Tensor,
                choose: Choose) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Codebooks 1..G-1 ``[B, G-1]`` of one frame per row, and their embeddings (each
        ``[B, 1, hidden]``, codebook ``i`` embedded with ``codec_embedding[i-1]``), from the talker's
        last normed hidden state and codebook 0's embedding (both ``[B, 1, hidden]``; the exact
        mode runs B = 1, the throughput mode all rows of a step, every row at the same positions)."""
        cache = KVCache(len(self.model.layers))
        embeds = self.model.codec_embedding
        codes = [choose(0, self._forward(torch.cat((talker_hidden, first_embed), dim=1), cache, 0))]
        code_embeds = []
        for step in range(1, self.num_steps):
            code_embeds.append(embeds[step - 1](codes[-1].view(-1, 1)))
            codes.append(choose(step, self._forward(code_embeds[-1], cache, step)))
        code_embeds.append(embeds[self.num_steps - 1](codes[-1].view(-1, 1)))
        return torch.stack(codes, dim=1).view(talker_hidden.shape[0], -1), code_embeds
