"""The thinker's text model (checkpoint prefix ``thinker.``): a Qwen3-MoE causal LM that writes the
text answer.

``thinker.model.embed_tokens``, ``thinker.model.layers.{i}`` (attention with q/k norms, then a
sparse MoE block or, for ``mlp_only_layers`` / ``decoder_sparse_step``, a dense MLP),
``thinker.model.norm`` and ``thinker.lm_head``. The encoders are modules of their own
(:class:`~.audio_tower.AudioTower`, :class:`~.vision_encoder.VisionEncoder`); their output replaces
the token embeddings at the placeholders (:func:`~.prompt_embeds.prompt_embeds`).

A forward returns what the talker needs besides the logits: the layer-0 input embeddings of the
tokens it ran (the talker's text channel is ``text_projection`` of them) and, when asked, the
hidden state ``accept_hidden_layer`` (the talker reads it only at multimodal placeholder
positions of the prompt).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from omni_backend.models.qwen3_common.layers import RMSNorm

from .config import MoeTextConfig
from .layers import KVCache, MoeDecoderLayer, MultimodalRotary, rms_norm, text_positions

__all__ = ["Thinker", "ThinkerModel", "ThinkerOutput"]


@dataclass
class ThinkerOutput:
    logits: torch.Tensor            # [B, L or logits_rows, vocab]
    embeds: torch.Tensor            # [B, L, hidden]: layer-0 inputs (token embeddings)
    accept_hidden: torch.Tensor | None  # [B, L, hidden]: hidden state ``accept_layer`` when asked


class ThinkerModel(nn.Module):
    """Checkpoint prefix ``thinker.model.``."""

    def __init__(self, config: MoeTextConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([MoeDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)


class Thinker(nn.Module):
    """Checkpoint prefix ``thinker.``."""

    def __init__(self, config: MoeTextConfig) -> None:
        super().__init__()
        self.config = config
        self.model = ThinkerModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self._rotary: MultimodalRotary | None = None

    @property
    def rotary(self) -> MultimodalRotary:
        if self._rotary is None:
            c = self.config
            self._rotary = MultimodalRotary(c.rope_theta, c.head_dim, c.mrope_section, self.lm_head.weight.device)
        return self._rotary

    def new_cache(self) -> KVCache:
        return KVCache(self.config.num_hidden_layers)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings ``[..., hidden]`` of ``ids``."""
        return self.model.embed_tokens(ids)

    def forward(self, ids: torch.Tensor, cache: KVCache | None = None, position_ids: torch.Tensor | None = None,
                accept_layer: int | None = None, logits_rows: int | None = None,
                inputs_embeds: torch.Tensor | None = None, deepstack: list[torch.Tensor] | None = None,
                visual_mask: torch.Tensor | None = None) -> ThinkerOutput:
        """Run ``ids`` ``[1, L]`` after the ``cache``'s positions (text positions unless
        ``position_ids`` ``[3, 1, L]`` are given). The LM head runs over all ``L`` positions, as
        the reference's prefill does, or over the last ``logits_rows`` only (a long prompt's
        ``[L, vocab]`` logits are large; the last row's bits equal the all-rows ones when both
        row counts are common shapes, see :mod:`.prompt`). ``inputs_embeds``: the layer-0 input
        instead of ``ids``' embeddings (media merged in, :func:`~.prompt_embeds.prompt_embeds`). ``deepstack``: the
        vision encoder's features, added after layer ``i`` to the hidden states at ``visual_mask``
        ``[1, L]`` (the hidden state a layer hands the talker is taken before that addition, as the
        reference records it)."""
        embeds = self.embed(ids) if inputs_embeds is None else inputs_embeds
        if position_ids is None:
            start = cache.length if cache is not None else 0
            position_ids = text_positions(start, ids.shape[1], ids.device)
        cos, sin = self.rotary(position_ids, embeds.dtype)
        hidden = embeds
        accept = embeds if accept_layer == 0 else None
        layers = self.model.layers
        for index, layer in enumerate(layers):
            hidden = layer(hidden, cos, sin, cache)
            if accept_layer == index + 1 and index + 1 < len(layers):
                accept = hidden
            if deepstack is not None and index < len(deepstack):
                hidden = hidden.clone()
                hidden[visual_mask, :] = hidden[visual_mask, :] + deepstack[index].to(hidden.device, hidden.dtype)
        norm = self.model.norm
        hidden = rms_norm(hidden, norm.weight, norm.variance_epsilon)
        if accept_layer == len(layers):
            accept = hidden  # the reference's last hidden state is the normed one
        if logits_rows is not None:
            hidden = hidden[:, -logits_rows:]
        return ThinkerOutput(self.lm_head(hidden), embeds, accept)
