"""Static per-slot KV cache.

One preallocated ``[num_slots, num_kv_heads, max_len, head_dim]`` key and value buffer per layer.
A running sequence owns one slot (a row) for its whole life; its keys sit at positions
``0..length-1`` of that row. Nothing is allocated while decoding, so the buffers keep their
addresses: what CUDA-graph capture per batch-size bucket will need.
"""
from __future__ import annotations

import torch

__all__ = ["StaticKVCache", "length_buckets", "SHORTEST_LENGTH_BUCKET"]

SHORTEST_LENGTH_BUCKET = 256


def length_buckets(max_model_len: int, shortest: int = SHORTEST_LENGTH_BUCKET) -> list[int]:
    """Attention lengths a static step is captured for: doubling from ``shortest``, and
    ``max_model_len`` (a step reads a slot up to its batch's furthest position rounded up to one,
    not the whole cache)."""
    out, length = [], shortest
    while length < max_model_len:
        out.append(length)
        length *= 2
    return out + [max_model_len]


class StaticKVCache:
    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, max_len: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        if num_slots < 1 or max_len < 1:
            raise ValueError(f"num_slots and max_len must be >= 1 (got {num_slots}, {max_len})")
        shape = (num_slots, num_kv_heads, max_len, head_dim)
        self.num_slots = num_slots
        self.max_len = max_len
        # positions at or beyond a slot's valid length are never read, so the buffers start empty
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def write_prefix(self, layer: int, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``k``/``v`` of shape ``[1, heads, L, dim]`` at positions ``0..L-1`` of ``slot``."""
        length = k.shape[2]
        self.keys[layer][slot, :, :length].copy_(k[0])
        self.values[layer][slot, :, :length].copy_(v[0])

    def write_rows(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor) -> None:
        """Write one position per row: ``k``/``v`` ``[B, heads, 1, dim]`` at ``(slots[b], positions[b])``."""
        self.keys[layer][slots, :, positions] = k[:, :, 0]
        self.values[layer][slots, :, positions] = v[:, :, 0]

    def write_block(self, layer: int, rows: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``k``/``v`` ``[rows, heads, n, dim]`` at positions ``start..start+n-1`` of slots ``0..rows-1``
        (the code predictor's batch, where every row is at the same position)."""
        n = k.shape[2]
        self.keys[layer][:rows, :, start:start + n].copy_(k)
        self.values[layer][:rows, :, start:start + n].copy_(v)

    def rows(self, layer: int, rows: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[rows, heads, length, dim]`` of slots ``0..rows-1`` (views)."""
        return self.keys[layer][:rows, :, :length], self.values[layer][:rows, :, :length]

    def view(self, layer: int, slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[1, heads, length, dim]`` of one slot (views, no copy)."""
        return (self.keys[layer][slot:slot + 1, :, :length], self.values[layer][slot:slot + 1, :, :length])
