"""The thinker's vision encoder (checkpoint prefix ``thinker.visual.``): image patches -> one
embedding per image placeholder token, plus the "deepstack" features the thinker adds to its
first layers' hidden states at those tokens.

Module names equal the checkpoint keys: ``patch_embed.proj`` (a Conv3d over ``temporal_patch_size``
frames of ``patch_size``-pixel squares), ``pos_embed`` (a learned square grid of positions,
resampled bilinearly, corners aligned, to each image's patch grid), ``blocks.{i}`` (pre-norm ViT
blocks: ``norm1`` / ``norm2``, ``attn.qkv`` / ``attn.proj`` with 2-D rotary positions,
``mlp.linear_fc1`` / ``linear_fc2``), ``merger`` (the 2x2 patch merger to the thinker's width) and
``merger_list.{j}`` (one merger per ``deepstack_visual_indexes`` block, normed after the merge).

The arithmetic follows transformers 5's ``Qwen3OmniMoeVisionEncoder`` operation for operation:
patches arrive in the image processor's merge-block order, attention runs per image (per frame),
each its own SDPA call.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import VisionConfig
from .layers import rotate_half

__all__ = ["VisionEncoder", "VisionOutput"]


def _gelu(name: str):
    approximate = "tanh" if name == "gelu_pytorch_tanh" else "none"
    return lambda x: F.gelu(x, approximate=approximate)


class PatchEmbed(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.c = c
        kernel = [c.temporal_patch_size, c.patch_size, c.patch_size]
        self.proj = nn.Conv3d(c.in_channels, c.hidden_size, kernel_size=kernel, stride=kernel, bias=True)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        c = self.c
        x = pixels.view(-1, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size)
        return self.proj(x.to(dtype=self.proj.weight.dtype)).view(-1, c.hidden_size)


class VisionAttention(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.num_heads = c.num_heads
        self.scaling = (c.hidden_size // c.num_heads) ** -0.5
        self.qkv = nn.Linear(c.hidden_size, c.hidden_size * 3, bias=True)
        self.proj = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, x: torch.Tensor, lengths: list[int], cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv(x).reshape(n, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
        dtype = q.dtype
        q, k = q.float(), k.float()
        cos, sin = cos.unsqueeze(-2).float(), sin.unsqueeze(-2).float()
        q = ((q * cos) + (rotate_half(q) * sin)).to(dtype)
        k = ((k * cos) + (rotate_half(k) * sin)).to(dtype)
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        outputs = []
        for qw, kw, vw in zip(*(torch.split(t, lengths, dim=2) for t in (q, k, v))):
            out = F.scaled_dot_product_attention(qw, kw, vw, attn_mask=None, dropout_p=0.0, scale=self.scaling,
                                                 is_causal=False)
            outputs.append(out.reshape(out.shape[0], -1, qw.shape[2], vw.shape[-1]).transpose(1, 2).contiguous())
        return self.proj(torch.cat(outputs, dim=1).reshape(n, -1).contiguous())


class VisionMLP(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(c.hidden_size, c.intermediate_size, bias=True)
        self.linear_fc2 = nn.Linear(c.intermediate_size, c.hidden_size, bias=True)
        self.act = _gelu(c.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act(self.linear_fc1(x)))


class VisionBlock(nn.Module):
    def __init__(self, c: VisionConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(c.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(c.hidden_size, eps=1e-6)
        self.attn = VisionAttention(c)
        self.mlp = VisionMLP(c)

    def forward(self, x: torch.Tensor, lengths: list[int], cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), lengths, cos, sin)
        return x + self.mlp(self.norm2(x))


class PatchMerger(nn.Module):
    """``ln_q`` then ``mlp.0`` -> GELU -> ``mlp.2`` over each 2x2 block of patches; the deepstack
    mergers norm after grouping the block (``postshuffle``)."""

    def __init__(self, c: VisionConfig, postshuffle: bool) -> None:
        super().__init__()
        self.width = c.hidden_size * c.spatial_merge_size ** 2
        self.postshuffle = postshuffle
        self.ln_q = nn.LayerNorm(self.width if postshuffle else c.hidden_size, eps=1e-6)
        self.mlp = nn.ModuleList([nn.Linear(self.width, self.width), nn.GELU(),
                                  nn.Linear(self.width, c.out_hidden_size)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln_q(x.view(-1, self.width) if self.postshuffle else x).view(-1, self.width)
        for layer in self.mlp:
            x = layer(x)
        return x


class VisionOutput:
    def __init__(self, embeds: torch.Tensor, deepstack: list[torch.Tensor]) -> None:
        self.embeds = embeds          # [tokens, out_hidden]: one per image placeholder
        self.deepstack = deepstack    # per deepstack block, [tokens, out_hidden]


class VisionEncoder(nn.Module):
    """Checkpoint prefix ``thinker.visual.``."""

    def __init__(self, config: VisionConfig) -> None:
        super().__init__()
        c = self.config = config
        self.merger_list = nn.ModuleList([PatchMerger(c, postshuffle=True) for _ in c.deepstack_visual_indexes])
        self.patch_embed = PatchEmbed(c)
        self.pos_embed = nn.Embedding(c.num_position_embeddings, c.hidden_size)
        self.blocks = nn.ModuleList([VisionBlock(c) for _ in range(c.depth)])
        self.merger = PatchMerger(c, postshuffle=False)
        self.side = int(c.num_position_embeddings ** 0.5)

    def _block_order(self, grid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Row and column of every patch, in the processor's merge-block order."""
        m = self.config.spatial_merge_size
        rows, cols = [], []
        for t, h, w in grid.tolist():
            r, c = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
            shape = (h // m, m, w // m, m)
            rows.append(r.reshape(shape).transpose(1, 2).flatten().repeat(t))
            cols.append(c.reshape(shape).transpose(1, 2).flatten().repeat(t))
        return torch.cat(rows), torch.cat(cols)

    def _positions(self, grid: torch.Tensor, device: torch.device) -> torch.Tensor:
        """The learned grid resampled bilinearly (corners aligned) to each image's patches."""
        side = self.side
        rows, cols = self._block_order(grid)
        counts = grid.prod(-1)
        heights = torch.repeat_interleave(grid[:, 1], counts)
        widths = torch.repeat_interleave(grid[:, 2], counts)

        def taps(index: torch.Tensor, size: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            src = index.to(torch.float32) * (side - 1) / torch.clamp(size - 1, min=1)
            floor = torch.floor(src)
            offsets = torch.arange(0, 2)
            where = (floor.long()[:, None] + offsets).clamp(0, side - 1)
            weight = (1 - (src[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
            return where, weight

        h_taps, h_weights = taps(rows, heights)
        w_taps, w_weights = taps(cols, widths)
        indices = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, 4).to(device)
        weights = (h_weights[:, :, None] * w_weights[:, None, :]).reshape(-1, 4).to(device)
        return (self.pos_embed(indices) * weights[:, :, None]).sum(1)

    def _rotary(self, grid: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        dim = c.hidden_size // c.num_heads // 2
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        rows, cols = self._block_order(grid)
        position_ids = torch.stack([rows, cols], dim=-1).to(device)
        freqs = position_ids[..., None].float() * inv_freq.to(device=device, dtype=torch.float)
        cos, sin = freqs.cos(), freqs.sin()

        def recompose(f: torch.Tensor) -> torch.Tensor:
            hw = torch.cat([f[:, 0], f[:, 1]], dim=-1)
            return torch.cat([hw, hw], dim=-1)
        return recompose(cos), recompose(sin)

    def forward(self, pixels: torch.Tensor, grid: torch.Tensor) -> VisionOutput:
        """``pixels`` ``[patches, C * T * P * P]`` of the images in order, ``grid`` ``[images, 3]``
        (t, h, w in patches) -> their placeholder embeddings and deepstack features."""
        device = self.patch_embed.proj.weight.device
        grid = grid.to("cpu", torch.long)
        lengths = torch.repeat_interleave(grid[:, 1] * grid[:, 2], grid[:, 0]).tolist()
        x = self.patch_embed(pixels.to(device))
        x = x + self._positions(grid, device).to(x.dtype)
        cos, sin = self._rotary(grid, device)
        x = x.reshape(x.shape[0], -1)
        deepstack = []
        indexes = list(self.config.deepstack_visual_indexes)
        for number, block in enumerate(self.blocks):
            x = block(x, lengths, cos, sin)
            if number in indexes:
                deepstack.append(self.merger_list[indexes.index(number)](x))
        return VisionOutput(self.merger(x), deepstack)
