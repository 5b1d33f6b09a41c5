"""The rotary tables of Qwen3-TTS's talker and code predictor.

They reproduce the reference's bits (``qwen-tts==0.1.1`` on transformers 4.57.3): on CPU the bits
of ``cos`` depend on the shape it is computed in, so decode positions are computed one at a time,
in the reference's decode shape (:class:`TalkerRotary`, :class:`CodePredictorRotary`).
"""
from __future__ import annotations

import torch

__all__ = ["TalkerRotary", "CodePredictorRotary", "default_inv_freq"]


def default_inv_freq(rope_theta: float, head_dim: int) -> torch.Tensor:
    """Inverse frequencies of the default RoPE (computed as transformers computes them)."""
    return 1.0 / (rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim))


class TalkerRotary:
    """The talker's multimodal RoPE with interleaved sections. TTS uses equal temporal, height and
    width positions, which makes it plain RoPE in value; the bits are reproduced by computing
    the three copies and the interleaved selection the way the reference does.

    ``prefill(length)`` computes positions ``0..length-1`` in one tensor (the reference's prefill
    shape). Decode positions come from a per-position table filled lazily, each position computed
    alone (the reference's decode shape).
    """

    def __init__(self, rope_theta: float, head_dim: int, mrope_section: tuple[int, ...], interleaved: bool,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.inv_freq = default_inv_freq(rope_theta, head_dim).to(device)
        self.head_dim = head_dim
        self.mrope_section = list(mrope_section)
        self.interleaved = interleaved
        self.dtype = dtype
        self.device = device
        self._cos = torch.empty(0, head_dim, dtype=dtype, device=device)
        self._sin = torch.empty(0, head_dim, dtype=dtype, device=device)

    def _compute(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[1, 1, L, D]`` for a single sequence at ``positions`` ``[L]``."""
        position_ids = positions.view(1, 1, -1).expand(3, 1, -1)
        inv_freq_expanded = self.inv_freq[None, None, :, None].float().expand(3, position_ids.shape[1], -1, 1)
        position_ids_expanded = position_ids[:, :, None, :].float()
        freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(2, 3)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * 1.0).to(self.dtype)
        sin = (emb.sin() * 1.0).to(self.dtype)
        return self._select(cos), self._select(sin)

    def _select(self, table: torch.Tensor) -> torch.Tensor:
        """Merge the three position copies ``[3, B, L, D]`` into ``[B, 1, L, D]``."""
        section = self.mrope_section
        if self.interleaved:
            half = table[..., : self.head_dim // 2]
            merged = half[0].clone()
            modality = len(section)
            for i, n in enumerate(section[1:], 1):
                merged[..., i:n * modality:modality] = half[i, ..., i:n * modality:modality]
            return torch.cat([merged] * 2, dim=-1).unsqueeze(1)
        doubled = section * 2
        return torch.cat([m[i % 3] for i, m in enumerate(table.split(doubled, dim=-1))], dim=-1).unsqueeze(1)

    def prefill(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[1, 1, length, D]`` of positions ``0..length-1``."""
        return self._compute(torch.arange(length, device=self.device))

    def table(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[length, D]`` of positions ``0..length-1`` computed in one tensor (the prefill
        shape): the static step's table, which indexes it on the device."""
        cos, sin = self.prefill(length)
        return cos[0, 0], sin[0, 0]

    def ensure(self, upto: int) -> None:
        """Fill the decode table for positions ``< upto``."""
        have = self._cos.shape[0]
        if upto <= have:
            return
        size = max(upto, 2 * have, 64)
        cos = torch.empty(size, self.head_dim, dtype=self.dtype, device=self.device)
        sin = torch.empty_like(cos)
        cos[:have] = self._cos
        sin[:have] = self._sin
        for p in range(have, size):
            c, s = self._compute(torch.tensor([p], device=self.device))
            cos[p] = c[0, 0, 0]
            sin[p] = s[0, 0, 0]
        self._cos, self._sin = cos, sin

    def decode(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[B, 1, 1, D]`` for one new position per row."""
        self.ensure(int(positions.max()) + 1)
        return self._cos[positions][:, None, None, :], self._sin[positions][:, None, None, :]


class CodePredictorRotary:
    """Plain RoPE of the code predictor. Its positions are the same for every frame (a 2-token
    prefill at 0..1, then one token per step), so all tables are computed once, each in the
    reference's shape."""

    def __init__(self, rope_theta: float, head_dim: int, num_steps: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.inv_freq = default_inv_freq(rope_theta, head_dim).to(device)
        self.dtype = dtype
        self.tables: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.prefill_table = self._compute(torch.arange(2, device=device))
        for position in range(2, num_steps + 1):
            self.tables[position] = self._compute(torch.tensor([position], device=device))

    def _compute(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[1, 1, L, D]``."""
        position_ids = positions.unsqueeze(0)
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        position_ids_expanded = position_ids[:, None, :].float()
        freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * 1.0).to(self.dtype)
        sin = (emb.sin() * 1.0).to(self.dtype)
        return cos.unsqueeze(1), sin.unsqueeze(1)

    def at(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tables[position]
