"""Multimodal rotary positions (time, height, width) of a prompt with images, as the reference's
``get_rope_index`` builds them for the thinker and, over the talker's input ids, for the talker.

Text advances all three components by one per token. An image (``<|vision_start|>``, its
placeholders, ``<|vision_end|>``) places its placeholders on its merged patch grid: time
``t * position_id_per_seconds`` (0 for an image), height and width the block row and column, all
offset by the position after the text before it; the text after it resumes at the largest position
so far plus one. An audio span (``<|audio_start|>`` .. ``<|audio_end|>``) advances like text. A
prompt without images keeps plain positions (the reference takes its text path then, audio or
not). Decoding continues at ``cache length + delta``, ``delta`` = largest position + 1 - length.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

if TYPE_CHECKING:
    from .config import Qwen3OmniConfig

__all__ = ["MediaTokens", "rope_positions", "thinker_media_tokens", "talker_media_tokens"]


@dataclass(frozen=True)
class MediaTokens:
    """Token ids and the merge size the positions read (the thinker's or the talker's config)."""

    image_token_id: int
    video_token_id: int
    audio_token_id: int
    vision_start_token_id: int
    audio_start_token_id: int
    spatial_merge_size: int
    position_id_per_seconds: float


def thinker_media_tokens(config: "Qwen3OmniConfig") -> MediaTokens:
    """The media tokens of the thinker's input ids."""
    merge = config.vision.spatial_merge_size if config.vision is not None else 2
    return MediaTokens(config.image_token_id, config.video_token_id, config.audio_token_id,
                       config.vision_start_token_id, config.audio_start_token_id, merge,
                       config.position_id_per_seconds)


def talker_media_tokens(config: "Qwen3OmniConfig") -> MediaTokens:
    """The media tokens of the talker's input ids (its config's, else the thinker's)."""
    talker = config.raw.get("talker_config") or {}
    base = thinker_media_tokens(config)
    return MediaTokens(int(talker.get("image_token_id", base.image_token_id)),
                       int(talker.get("video_token_id", base.video_token_id)),
                       int(talker.get("audio_token_id", base.audio_token_id)),
                       int(talker.get("vision_start_token_id", base.vision_start_token_id)),
                       int(talker.get("audio_start_token_id", base.audio_start_token_id)),
                       int(talker.get("spatial_merge_size", base.spatial_merge_size)),
                       config.talker_position_id_per_seconds)


def rope_positions(ids: Sequence[int], tokens: MediaTokens, image_grids: Sequence[Sequence[int]],
                   audio_tokens: Sequence[int]) -> tuple[torch.Tensor, int]:
    """Positions ``[3, L]`` (float32, integral values) of ``ids`` and the decode ``delta``.
    ``image_grids``: ``(t, h, w)`` in patches per image in order; ``audio_tokens``: placeholder
    count per recording in order."""
    ids = list(ids)
    length = len(ids)
    if not image_grids:
        return torch.arange(length, dtype=torch.float32).view(1, -1).expand(3, -1).clone(), 0
    if tokens.video_token_id in ids:
        raise ValueError("video placeholders are not supported")
    merge = tokens.spatial_merge_size
    starts = [i for i, t in enumerate(ids) if t == tokens.vision_start_token_id]
    image_count = sum(1 for i in starts if i + 1 < length and ids[i + 1] == tokens.image_token_id)
    audio_count = ids.count(tokens.audio_start_token_id)
    pieces: list[torch.Tensor] = []
    st = 0
    image_index = audio_index = 0
    remain_images, remain_audios = image_count, audio_count

    def next_start() -> int:
        return int(pieces[-1].max()) + 1 if pieces else 0

    for _ in range(image_count + audio_count):
        st_idx = next_start()
        vision_at = ids.index(tokens.vision_start_token_id, st) \
            if tokens.image_token_id in ids and remain_images > 0 else length + 1
        audio_at = ids.index(tokens.audio_start_token_id, st) \
            if tokens.audio_token_id in ids and remain_audios > 0 else length + 1
        first = min(vision_at, audio_at)
        text = first - st
        if text:
            pieces.append(torch.arange(text).view(1, -1).expand(3, -1) + st_idx)
            st_idx += text
        pieces.append(torch.arange(1).view(1, -1).expand(3, -1) + st_idx)   # the span's start token
        st_idx += 1
        if first == audio_at:
            count = int(audio_tokens[audio_index])
            pieces.append(torch.arange(count).view(1, -1).expand(3, -1) + st_idx)
            st += text + 1 + count + 1
            audio_index += 1
            remain_audios -= 1
        else:
            t, h, w = (int(x) for x in image_grids[image_index])
            gh, gw = h // merge, w // merge
            t_index = (torch.arange(t) * 1 * tokens.position_id_per_seconds).float()
            h_index = torch.arange(gh).view(1, -1, 1).expand(t, -1, gw).flatten().float()
            w_index = torch.arange(gw).view(1, 1, -1).expand(t, gh, -1).flatten().float()
            t_index = t_index.view(-1, 1).expand(-1, gh * gw).flatten()
            pieces.append(torch.stack([t_index, h_index, w_index]) + st_idx)
            st += text + 1 + t * h * w // (merge * merge) + 1
            image_index += 1
            remain_images -= 1
        pieces.append(torch.arange(1).view(1, -1).expand(3, -1) + next_start())   # the span's end token
    if st < length:
        pieces.append(torch.arange(length - st).view(1, -1).expand(3, -1) + next_start())
    positions = torch.cat([p.float() for p in pieces], dim=1).reshape(3, -1)
    if positions.shape[1] != length:
        raise ValueError(f"media spans do not match the prompt: {positions.shape[1]} positions for {length} tokens")
    return positions, int(positions.max()) + 1 - length
