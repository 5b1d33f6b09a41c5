"""The thinker's audio encoder (checkpoint prefix ``thinker.audio_tower.``): log-mel features ->
one embedding per audio placeholder token, in the thinker's hidden size.

Module names equal the checkpoint keys: ``conv2d1..3`` (3x3, stride 2, GELU), ``conv_out``,
``layers.{i}`` (pre-norm encoder layers: ``self_attn`` with ``q/k/v/out_proj``,
``self_attn_layer_norm``, ``fc1`` / ``fc2``, ``final_layer_norm``), ``ln_post``, ``proj1`` and
``proj2``; the sinusoid position table is not in the checkpoint (made here, as the reference does).

The arithmetic follows transformers 5's ``Qwen3OmniMoeAudioEncoder`` operation for operation and in
its tensor shapes (on CPU a matmul's bits depend on its shape): the features are cut into chunks of
``n_window * 2`` mel frames (the last one shorter), padded to the longest chunk, convolved per
group of ``conv_chunksize`` chunks, given sinusoid positions per chunk, and the valid frames run
through the encoder layers with attention inside windows of ``n_window_infer`` frames' worth of
tokens, each window its own SDPA call as the reference's SDPA path does.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .config import AudioTowerConfig

__all__ = ["AudioTower"]


def _sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    increment = np.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-increment * torch.arange(channels // 2).float())
    scaled_time = torch.arange(length)[:, np.newaxis] * inv_timescales[np.newaxis, :]
    return torch.cat([torch.sin(scaled_time), torch.cos(scaled_time)], dim=1)


class AudioAttention(nn.Module):
    def __init__(self, config: AudioTowerConfig) -> None:
        super().__init__()
        d = config.d_model
        self.num_heads = config.encoder_attention_heads
        self.scaling = (d // self.num_heads) ** -0.5
        self.k_proj = nn.Linear(d, d, bias=True)
        self.v_proj = nn.Linear(d, d, bias=True)
        self.q_proj = nn.Linear(d, d, bias=True)
        self.out_proj = nn.Linear(d, d, bias=True)

    def forward(self, hidden: torch.Tensor, window_lengths: list[int]) -> torch.Tensor:
        """``hidden`` ``[tokens, d]``; attention within consecutive windows of ``window_lengths``."""
        tokens = hidden.shape[0]
        q = self.q_proj(hidden).reshape(tokens, self.num_heads, -1).transpose(0, 1).unsqueeze(0)
        k = self.k_proj(hidden).reshape(tokens, self.num_heads, -1).transpose(0, 1).unsqueeze(0)
        v = self.v_proj(hidden).reshape(tokens, self.num_heads, -1).transpose(0, 1).unsqueeze(0)
        outputs = []
        for qw, kw, vw in zip(*(torch.split(t, window_lengths, dim=2) for t in (q, k, v))):
            out = F.scaled_dot_product_attention(qw, kw, vw, attn_mask=None, dropout_p=0.0, scale=self.scaling,
                                                 is_causal=False)
            out = out.reshape(out.shape[0], -1, qw.shape[2], vw.shape[-1]).transpose(1, 2).contiguous()
            outputs.append(out)
        return self.out_proj(torch.cat(outputs, dim=1).reshape(tokens, -1).contiguous())


class AudioEncoderLayer(nn.Module):
    def __init__(self, config: AudioTowerConfig) -> None:
        super().__init__()
        d = config.d_model
        self.self_attn = AudioAttention(config)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, config.encoder_ffn_dim)
        self.fc2 = nn.Linear(config.encoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)
        if config.activation_function != "gelu":
            raise ValueError(f"thinker_config.audio_config.activation_function: {config.activation_function!r} is "
                             "not supported (gelu)")

    def forward(self, hidden: torch.Tensor, window_lengths: list[int]) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.self_attn_layer_norm(hidden), window_lengths)
        return hidden + self.fc2(F.gelu(self.fc1(self.final_layer_norm(hidden))))


class AudioTower(nn.Module):
    """Checkpoint prefix ``thinker.audio_tower.``."""

    def __init__(self, config: AudioTowerConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        ds = c.downsample_hidden_size
        self.conv2d1 = nn.Conv2d(1, ds, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(ds, ds, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(ds, ds, 3, 2, padding=1)
        self.conv_out = nn.Linear(ds * ((((c.num_mel_bins + 1) // 2 + 1) // 2 + 1) // 2), c.d_model, bias=False)
        self.layers = nn.ModuleList([AudioEncoderLayer(c) for _ in range(c.encoder_layers)])
        self.ln_post = nn.LayerNorm(c.d_model)
        self.proj1 = nn.Linear(c.d_model, c.d_model)
        self.proj2 = nn.Linear(c.d_model, c.output_dim)
        self._positions: torch.Tensor | None = None
        if c.scale_embedding:
            raise ValueError("thinker_config.audio_config.scale_embedding: true is not supported "
                             "(the reference never applies the scale)")

    def positions(self, device: torch.device) -> torch.Tensor:
        if self._positions is None or self._positions.device != device:
            self._positions = _sinusoids(self.config.max_source_positions, self.config.d_model).to(device)
        return self._positions

    def _chunk_lengths(self, feature_lens: list[int]) -> list[int]:
        chunk = self.config.chunk_frames
        lengths: list[int] = []
        for n in feature_lens:
            full, tail = divmod(int(n), chunk)
            lengths += [chunk] * full + ([tail] if tail else [])
        return lengths

    def window_lengths(self, feature_lens: list[int], chunk_lengths: list[int]) -> list[int]:
        """Token counts of the attention windows (the reference's ``cu_seqlens`` steps)."""
        c = self.config
        longest = max(c.output_length(n) for n in chunk_lengths)
        window = longest * (c.n_window_infer // c.chunk_frames)
        out: list[int] = []
        for n in feature_lens:
            tokens = c.output_length(int(n))
            out += [window] * (tokens // window)
            if tokens % window:
                out.append(tokens % window)
        return out

    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        """Log-mel ``features`` ``[mel_bins, frames]`` per recording (a request's recordings in order,
        encoded together as the reference encodes a prompt's) -> ``[tokens, output_dim]`` each."""
        c = self.config
        lens = [int(f.shape[-1]) for f in features]
        if not lens or min(lens) < 1:
            raise ValueError("every recording needs at least one feature frame")
        dtype = self.conv2d1.weight.dtype
        joined = torch.cat(list(features), dim=1)
        chunk_lengths = self._chunk_lengths(lens)
        chunks = joined.T.split(chunk_lengths, dim=0)
        padded = nn.utils.rnn.pad_sequence(chunks, batch_first=True).transpose(1, 2)
        padded = padded.unsqueeze(1).to(dtype=dtype)
        embeds = []
        for group in padded.split(c.conv_chunksize, dim=0):
            x = F.gelu(self.conv2d1(group))
            x = F.gelu(self.conv2d2(x))
            embeds.append(F.gelu(self.conv2d3(x)))
        x = torch.cat(embeds, dim=0)
        b, ch, f, t = x.size()
        x = self.conv_out(x.permute(0, 3, 1, 2).contiguous().view(b, t, ch * f))
        x = x + self.positions(x.device)[: x.shape[1], :].unsqueeze(0).to(x.dtype)
        after = torch.tensor([c.output_length(n) for n in chunk_lengths], device=x.device)
        longest = int(after.max())
        valid = (torch.arange(longest, device=x.device) < after.unsqueeze(1)).flatten().nonzero().squeeze(-1)
        hidden = torch.index_select(x.reshape(-1, x.shape[-1]), 0, valid)
        windows = self.window_lengths(lens, chunk_lengths)
        for layer in self.layers:
            hidden = layer(hidden, windows)
        hidden = self.proj2(F.gelu(self.proj1(self.ln_post(hidden))))
        return list(hidden.split([c.output_length(n) for n in lens], dim=0))
