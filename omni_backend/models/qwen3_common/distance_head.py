"""The attention head the random checkpoints' stop rigs are built on: with RoPE, a query and a
key direction whose score peaks exactly at one relative distance (used by the Qwen3-TTS and
Qwen3-Omni writers to make a random model stop after a chosen number of tokens)."""
from __future__ import annotations

import math

import torch

__all__ = ["distance_head"]


def distance_head(theta_base: float, head_dim: int, distance: int, max_distance: int
                   ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Query and key directions (rotate-half RoPE layout) and the q/k norm gain for an attention
    head whose only key (the anchor) wins the softmax exactly when it lies ``distance`` positions
    back, against up to ``max_distance`` keys scored zero. The high-frequency pairs locate the
    distance; one low-frequency pair subtracts a near-constant so every other distance scores
    below zero."""
    half = head_dim // 2
    theta = float(theta_base) ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    high = list(range(half - 2))
    low = half - 1
    offsets = torch.arange(1, max_distance + 1, dtype=torch.float64)
    drop = sum(1 - torch.cos(offsets * theta[i]) for i in high)
    margin = float(drop.min()) / 2
    constant = len(high) - margin
    drift = constant * float(1 - torch.cos(max_distance * theta[low]))
    if margin <= 0.05 or drift > margin / 4:
        raise ValueError(f"stop rig: head_dim {head_dim} cannot locate distances up to {max_distance}")
    q_dir = torch.zeros(head_dim, dtype=torch.float64)
    k_dir = torch.zeros(head_dim, dtype=torch.float64)
    for i in high + [low]:
        amplitude = 1.0 if i != low else -constant
        q_dir[i] = amplitude * math.cos(distance * theta[i])
        q_dir[i + half] = -amplitude * math.sin(distance * theta[i])
        k_dir[i] = 1.0
    rms = lambda v: float(v.pow(2).mean().sqrt())  # noqa: E731
    sharpness = (math.log(max_distance) + 6.0) / margin
    gain = math.sqrt(sharpness * rms(q_dir) * rms(k_dir) * math.sqrt(head_dim))
    return q_dir.float(), k_dir.float(), gain
