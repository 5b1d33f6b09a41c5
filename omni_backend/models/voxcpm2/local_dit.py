"""The side module of every step: the local diffusion transformer (``feat_decoder.estimator``)
and its flow-matching Euler solver with classifier-free guidance (CFG-zero*), as ``voxcpm``'s
``UnifiedCFM.forward`` / ``solve_euler``.

The solver is batched across rows and graph-safe: a fixed number of steps, each row's noise drawn
beforehand from its own request's generator (:func:`draw_noise`), its guidance scale a tensor.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .config import MiniCPM4Config
from .minicpm import MiniCPMModel


def timestep_embedding(x: torch.Tensor, dim: int, scale: float = 1000) -> torch.Tensor:
    half = dim // 2
    freq = math.log(10000) / (half - 1)
    freq = torch.exp(torch.arange(half, dtype=x.dtype, device=x.device) * -freq)
    emb = scale * x.unsqueeze(1) * freq.unsqueeze(0)
    return torch.cat((emb.sin(), emb.cos()), dim=-1)


class TimestepMLP(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(dim, dim, bias=True)
        self.linear_2 = nn.Linear(dim, dim, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(nn.functional.silu(self.linear_1(x)))


class LocalDiT(nn.Module):
    """Velocity estimator: [mu (2 tokens), time, prefix condition patch, noisy patch] through a
    bidirectional MiniCPM4; the noisy patch's positions are the output."""

    def __init__(self, config: MiniCPM4Config, in_channels: int):
        super().__init__()
        h = config.hidden_size
        self.hidden_size = h
        self.in_proj = nn.Linear(in_channels, h, bias=True)
        self.cond_proj = nn.Linear(in_channels, h, bias=True)
        self.out_proj = nn.Linear(h, in_channels, bias=True)
        self.time_mlp = TimestepMLP(h)
        self.delta_time_mlp = TimestepMLP(h)
        self.decoder = MiniCPMModel(config)

    def forward(self, x: torch.Tensor, mu: torch.Tensor, t: torch.Tensor, cond: torch.Tensor,
                dt: torch.Tensor) -> torch.Tensor:
        """x [N, C, P], mu [N, 2 H], t / dt [N], cond [N, C, P'] -> velocity [N, C, P]."""
        x = self.in_proj(x.transpose(1, 2).contiguous())
        cond = self.cond_proj(cond.transpose(1, 2).contiguous())
        prefix = cond.size(1)
        t = self.time_mlp(timestep_embedding(t, self.hidden_size).to(x.dtype))
        dt = self.delta_time_mlp(timestep_embedding(dt, self.hidden_size).to(x.dtype))
        t = t + dt
        mu = mu.view(x.size(0), -1, x.size(-1))
        x = torch.cat([mu, t.unsqueeze(1), cond, x], dim=1)
        hidden, _ = self.decoder(x, is_causal=False)
        hidden = self.out_proj(hidden[:, prefix + mu.size(1) + 1:, :])
        return hidden.transpose(1, 2).contiguous()


class FlowMatchingHead(nn.Module):
    """``feat_decoder``: holds the estimator under its checkpoint name and runs the solver."""

    def __init__(self, config: MiniCPM4Config, in_channels: int, mean_mode: bool = False):
        super().__init__()
        self.in_channels = in_channels
        self.mean_mode = mean_mode
        self.estimator = LocalDiT(config, in_channels)

    @staticmethod
    def time_span(n_timesteps: int, device, dtype: torch.dtype, sway: float = 1.0) -> torch.Tensor:
        t_span = torch.linspace(1, 0, n_timesteps + 1, device=device, dtype=dtype)
        return t_span + sway * (torch.cos(torch.pi / 2 * t_span) - 1 + t_span)

    def forward(self, mu: torch.Tensor, noise: torch.Tensor, cond: torch.Tensor, n_timesteps: int,
                cfg_value: torch.Tensor) -> torch.Tensor:
        """mu [B, 2 H_dit], noise [B, C, P] (the solver's start), cond [B, C, P'], cfg_value [B] ->
        the patch [B, C, P]. Every row takes the same ``n_timesteps`` steps."""
        t_span = self.time_span(n_timesteps, mu.device, mu.dtype)
        x = noise
        b = x.size(0)
        t, dt = t_span[0], t_span[0] - t_span[1]
        zero_init_steps = max(1, int(len(t_span) * 0.04))
        cfg = cfg_value.to(x.dtype).view(b, 1, 1)
        mu_in = torch.cat([mu, torch.zeros_like(mu)], dim=0)
        cond_in = torch.cat([cond, cond], dim=0)
        for step in range(1, len(t_span)):
            if step <= zero_init_steps:
                dphi_dt = torch.zeros_like(x)
            else:
                x_in = torch.cat([x, x], dim=0)
                t_in = t.expand(2 * b).contiguous()
                dt_in = dt.expand(2 * b).contiguous() if self.mean_mode else torch.zeros_like(t_in)
                out = self.estimator(x_in, mu_in, t_in, cond_in, dt_in)
                pos, neg = out[:b], out[b:]
                pos_flat, neg_flat = pos.reshape(b, -1), neg.reshape(b, -1)
                st_star = (torch.sum(pos_flat * neg_flat, dim=1, keepdim=True)
                           / (torch.sum(neg_flat ** 2, dim=1, keepdim=True) + 1e-8)).view(b, 1, 1)
                dphi_dt = neg * st_star + cfg * (pos - neg * st_star)
            x = x - dt * dphi_dt
            t = t - dt
            if step < len(t_span) - 1:
                dt = t - t_span[step + 1]
        return x


def draw_noise(generator: torch.Generator, channels: int, patch_size: int, dtype: torch.dtype) -> torch.Tensor:
    """One step's solver start for one request, [C, P], from the request's own CPU generator: the
    reference draws ``torch.randn((1, C, P))`` from the global generator at each step, so a
    generator seeded as the reference's global one draws the same numbers."""
    return torch.randn((1, channels, patch_size), generator=generator, dtype=dtype)[0]
