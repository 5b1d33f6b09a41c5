"""The thinker's layer-0 input for a prompt with media: token embeddings, with the audio tower's
output at the audio placeholders (the reference's ``get_audio_features`` + ``masked_scatter``)."""
from __future__ import annotations

import torch

from .audio_tower import AudioTower
from .config import Qwen3OmniConfig
from .prompt import ThinkerPrompt
from .thinker import Thinker

__all__ = ["prompt_embeds"]


@torch.inference_mode()
def prompt_embeds(thinker: Thinker, audio_tower: AudioTower | None, config: Qwen3OmniConfig,
                  prompt: ThinkerPrompt) -> torch.Tensor | None:
    """``[1, L, hidden]`` for a prompt with media, None for a text-only one (the thinker embeds it)."""
    if not prompt.multimodal:
        return None
    if audio_tower is None:
        raise ValueError("the prompt holds audio but the audio tower is not loaded (load_checkpoint parts)")
    device = thinker.lm_head.weight.device
    audio = torch.cat(audio_tower([f.to(device) for f in prompt.audio_features]), dim=0)
    ids = torch.tensor([prompt.ids], dtype=torch.long, device=device)
    return thinker.merge_media(ids, config.audio_token_id, audio)
