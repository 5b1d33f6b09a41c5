"""The thinker's input for a prompt with media: token embeddings with the audio tower's and the
vision encoder's output at their placeholders (the reference's ``get_audio_features`` /
``get_image_features`` + ``masked_scatter``), the vision encoder's deepstack features and where they
go, and the multimodal rotary positions (:mod:`.media_positions`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .audio_tower import AudioTower
from .config import Qwen3OmniConfig
from .media_positions import rope_positions, thinker_media_tokens
from .prompt import ThinkerPrompt
from .thinker import Thinker
from .vision_encoder import VisionEncoder

__all__ = ["ThinkerInputs", "prompt_embeds"]


@dataclass
class ThinkerInputs:
    embeds: torch.Tensor                  # [1, L, hidden]
    positions: torch.Tensor               # [3, 1, L]
    delta: int                            # decode positions: cache length + delta
    deepstack: list[torch.Tensor] | None  # per layer, [image tokens, hidden]
    visual_mask: torch.Tensor | None      # [1, L] bool


def media_counts(config: Qwen3OmniConfig, prompt: ThinkerPrompt) -> tuple[list[tuple[int, int, int]], list[int]]:
    """Image grids and audio placeholder counts of a prompt, in order."""
    grids = [image.grid for image in prompt.images]
    audio = [config.audio.output_length(int(f.shape[-1])) for f in prompt.audio_features] if prompt.audio_features else []
    return grids, audio


@torch.inference_mode()
def prompt_embeds(thinker: Thinker, audio_tower: AudioTower | None, config: Qwen3OmniConfig,
                  prompt: ThinkerPrompt, visual: VisionEncoder | None = None) -> ThinkerInputs | None:
    """The thinker's input for a prompt with media, None for a text-only one (it embeds itself)."""
    if not prompt.multimodal:
        return None
    device = thinker.lm_head.weight.device
    ids = torch.tensor([prompt.ids], dtype=torch.long, device=device)
    embeds = thinker.embed(ids)
    if prompt.audio_features:
        if audio_tower is None:
            raise ValueError("the prompt holds audio but the audio tower is not loaded (load_checkpoint parts)")
        audio = torch.cat(audio_tower([f.to(device) for f in prompt.audio_features]), dim=0)
        embeds = _scatter(embeds, ids == config.audio_token_id, audio)
    deepstack = mask = None
    if prompt.images:
        if visual is None:
            raise ValueError("the prompt holds images but the vision encoder is not loaded (load_checkpoint parts)")
        pixels = torch.from_numpy(np.concatenate([image.pixels for image in prompt.images]))
        grid = torch.tensor([image.grid for image in prompt.images], dtype=torch.long)
        out = visual(pixels, grid)
        mask = ids == config.image_token_id
        embeds = _scatter(embeds, mask, out.embeds)
        deepstack = out.deepstack
    grids, audio_counts = media_counts(config, prompt)
    positions, delta = rope_positions(prompt.ids, thinker_media_tokens(config), grids, audio_counts)
    return ThinkerInputs(embeds, positions.unsqueeze(1).to(device), delta, deepstack, mask)


def _scatter(embeds: torch.Tensor, mask: torch.Tensor, media: torch.Tensor) -> torch.Tensor:
    if int(mask.sum()) != media.shape[0]:
        raise ValueError(f"{int(mask.sum())} placeholders for {media.shape[0]} media embeddings")
    return embeds.masked_scatter(mask.unsqueeze(-1), media.to(embeds.device, embeds.dtype))
