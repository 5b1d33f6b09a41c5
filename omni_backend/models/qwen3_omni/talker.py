"""The talker (checkpoint prefix ``talker.``): a Qwen3-MoE decoder over codec-frame embeddings that
predicts codebook 0 of each frame, plus the projections that bring the thinker's text into it.

* ``talker.model.layers.{i}``: attention with q/k norms, then a sparse MoE block with a shared
  expert and its sigmoid gate (every layer: the reference's talker layer always uses it);
* ``talker.model.codec_embedding`` (codebook 0 and the codec control ids), ``talker.model.norm``,
  ``talker.codec_head``;
* ``talker.text_projection`` / ``talker.hidden_projection``: ResizeMLPs from the thinker's hidden
  size to the talker's: the first for thinker token embeddings, the second for thinker hidden
  states (multimodal prompt positions only);
* ``talker.code_predictor``: :class:`~.code_predictor.CodePredictor`.
"""
from __future__ import annotations

import torch
from torch import nn

from omni_backend.models.qwen3_common.layers import RMSNorm, activation

from .code_predictor import Choose, CodePredictor
from .config import TalkerConfig
from .layers import KVCache, MoeDecoderLayer, MultimodalRotary, rms_norm, text_positions

__all__ = ["Talker", "TalkerModel", "ResizeMLP"]


class ResizeMLP(nn.Module):
    """``linear_fc2(act(linear_fc1(x)))``: thinker hidden size -> talker hidden size."""

    def __init__(self, in_size: int, intermediate_size: int, out_size: int, hidden_act: str) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(in_size, intermediate_size, bias=True)
        self.linear_fc2 = nn.Linear(intermediate_size, out_size, bias=True)
        self.act_fn = activation(hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act_fn(self.linear_fc1(x)))


class TalkerModel(nn.Module):
    """Checkpoint prefix ``talker.model.``."""

    def __init__(self, config: TalkerConfig) -> None:
        super().__init__()
        text = config.text
        self.layers = nn.ModuleList([MoeDecoderLayer(text, i) for i in range(text.num_hidden_layers)])
        self.norm = RMSNorm(text.hidden_size, eps=text.rms_norm_eps)
        self.codec_embedding = nn.Embedding(text.vocab_size, text.hidden_size)


class Talker(nn.Module):
    """Checkpoint prefix ``talker.``."""

    def __init__(self, config: TalkerConfig) -> None:
        super().__init__()
        self.config = config
        text = config.text
        self.model = TalkerModel(config)
        self.text_projection = ResizeMLP(config.thinker_hidden_size, text.intermediate_size, text.hidden_size,
                                         text.hidden_act)
        self.hidden_projection = ResizeMLP(config.thinker_hidden_size, text.intermediate_size, text.hidden_size,
                                           text.hidden_act)
        self.codec_head = nn.Linear(text.hidden_size, text.vocab_size, bias=False)
        self.code_predictor = CodePredictor(config.code_predictor)
        self._rotary: MultimodalRotary | None = None

    @property
    def rotary(self) -> MultimodalRotary:
        if self._rotary is None:
            t = self.config.text
            self._rotary = MultimodalRotary(t.rope_theta, t.head_dim, t.mrope_section, self.codec_head.weight.device)
        return self._rotary

    def new_cache(self) -> KVCache:
        return KVCache(self.config.text.num_hidden_layers)

    def embed_codec(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.codec_embedding(ids)

    def complete_frame(self, first: torch.Tensor, hidden: torch.Tensor,
                       choose: Choose) -> tuple[torch.Tensor, torch.Tensor]:
        """The first half of a frame step, one frame per row: from codebook 0 ``first`` ``[B]`` and the
        talker state that predicted it ``hidden`` ``[B, 1, hidden]``, the residual codebooks
        ``[B, G-1]`` (the code predictor) and the frame's summed codebook embeddings
        ``[B, 1, hidden]``: the next talker input before its trailing-text row is added."""
        first_embed = self.embed_codec(first.view(-1, 1).to(self.codec_head.weight.device))
        residual, residual_embeds = self.code_predictor.predict(hidden, first_embed, choose)
        return residual, torch.cat([first_embed] + residual_embeds, dim=1).sum(1, keepdim=True)

    def next_frame(self, frame_embed: torch.Tensor, text_row: torch.Tensor, cache: KVCache,
                   delta: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The second half of one sequence's frame step (the reference's shapes, B = 1): the talker
        forward over the frame's summed embeddings plus its trailing-text row, at the position after
        the cache's (``delta``: how far images moved the decode positions); logits and hidden as
        :meth:`forward`."""
        position = text_positions(cache.length + delta, 1, self.codec_head.weight.device)
        return self(frame_embed + text_row, cache, position)

    def forward(self, embeds: torch.Tensor, cache: KVCache | None = None,
                position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``embeds`` ``[1, L, hidden]`` after the cache's positions -> codec-head logits
        ``[1, L, vocab]`` and the normed last-layer hidden states ``[1, L, hidden]`` (the code
        predictor's input)."""
        if position_ids is None:
            start = cache.length if cache is not None else 0
            position_ids = text_positions(start, embeds.shape[1], embeds.device)
        cos, sin = self.rotary(position_ids, embeds.dtype)
        hidden = embeds
        for layer in self.model.layers:
            hidden = layer(hidden, cos, sin, cache)
        norm = self.model.norm
        hidden = rms_norm(hidden, norm.weight, norm.variance_epsilon)
        return self.codec_head(hidden), hidden
