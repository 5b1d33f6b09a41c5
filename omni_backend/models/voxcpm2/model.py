"""The VoxCPM2 language model with its side modules, under the checkpoint's names, and its loader.

One AR step (``voxcpm``'s ``VoxCPM2Model._inference`` loop body), batched across rows:

1. side module: the diffusion transformer turns the backbone's and residual LM's hidden states
   (``lm_to_dit_proj`` / ``res_to_dit_proj``) and the previous patch into the next latent patch;
2. the stop head reads the backbone's hidden state;
3. the local encoder embeds the new patch (``enc_to_lm_proj``), the backbone takes it one
   position further, its output goes through the scalar quantizer (``fsq_layer``), and the
   residual LM takes ``fusion_concat_proj([backbone, patch embedding])`` one position further.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from .audio_vae import AudioVAE
from .config import VoxCPM2Config, load_config
from .local_dit import FlowMatchingHead
from .local_encoder import LocalEncoder
from .minicpm import MiniCPMModel, StaticKVCache


class ScalarQuantizer(nn.Module):
    def __init__(self, dim: int, latent_dim: int, scale: int):
        super().__init__()
        self.scale = scale
        self.in_proj = nn.Linear(dim, latent_dim)
        self.out_proj = nn.Linear(latent_dim, dim)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.in_proj(hidden))
        return self.out_proj(torch.round(hidden * self.scale) / self.scale)


@dataclass
class StepState:
    """Per row: what the next step starts from."""
    lm_hidden: torch.Tensor          # [B, H] the backbone's last hidden state (quantized after prefill)
    residual_hidden: torch.Tensor    # [B, H]
    prefix_cond: torch.Tensor        # [B, P, D] the previous patch


class VoxCPM2(nn.Module):
    def __init__(self, config: VoxCPM2Config):
        super().__init__()
        self.config = config
        lm = config.lm_config
        h = lm.hidden_size
        self.patch_size, self.feat_dim = config.patch_size, config.feat_dim
        self.base_lm = MiniCPMModel(lm)
        self.residual_lm = MiniCPMModel(config.residual_lm())
        self.feat_encoder = LocalEncoder(config.local_encoder(), config.feat_dim)
        self.feat_decoder = FlowMatchingHead(config.local_dit(), config.feat_dim, config.dit_mean_mode)
        self.fsq_layer = ScalarQuantizer(h, config.scalar_quantization_latent_dim, config.scalar_quantization_scale)
        self.enc_to_lm_proj = nn.Linear(config.encoder_config.hidden_dim, h)
        self.lm_to_dit_proj = nn.Linear(h, config.dit_config.hidden_dim)
        self.res_to_dit_proj = nn.Linear(h, config.dit_config.hidden_dim)
        self.fusion_concat_proj = nn.Linear(2 * h, h)
        self.stop_proj = nn.Linear(h, h)
        self.stop_head = nn.Linear(h, 2, bias=False)
        self.scale_emb = lm.scale_emb if lm.use_mup else 1.0

    # ------------------------------------------------------------------ prefill

    def prefill(self, text_token: torch.Tensor, text_mask: torch.Tensor, feat: torch.Tensor,
                feat_mask: torch.Tensor) -> tuple[StepState, list, list]:
        """One prompt (batch 1): tokens / masks [1, T], feats [1, T, P, D] -> the first step's state and
        the backbone's and residual LM's per-layer (k, v)."""
        feat_embed = self.enc_to_lm_proj(self.feat_encoder(feat))
        text_embed = self.base_lm.embed_tokens(text_token) * self.scale_emb
        combined = text_mask.unsqueeze(-1) * text_embed + feat_mask.unsqueeze(-1) * feat_embed
        enc_outputs, lm_kv = self.base_lm(combined, is_causal=True)
        enc_outputs = self.fsq_layer(enc_outputs) * feat_mask.unsqueeze(-1) + enc_outputs * text_mask.unsqueeze(-1)
        residual_in = self.fusion_concat_proj(torch.cat((enc_outputs, feat_mask.unsqueeze(-1) * feat_embed), dim=-1))
        residual_outputs, res_kv = self.residual_lm(residual_in, is_causal=True)
        state = StepState(enc_outputs[:, -1, :], residual_outputs[:, -1, :], feat[:, -1, ...])
        return state, lm_kv, res_kv

    # ------------------------------------------------------------------ one step

    def side_module(self, state: StepState, noise: torch.Tensor, n_timesteps: int,
                    cfg_value: torch.Tensor) -> torch.Tensor:
        """The diffusion transformer's patch for each row: [B, P, D]."""
        dit_hidden = torch.cat((self.lm_to_dit_proj(state.lm_hidden), self.res_to_dit_proj(state.residual_hidden)),
                               dim=-1)
        patch = self.feat_decoder(dit_hidden, noise, state.prefix_cond.transpose(1, 2).contiguous(),
                                  n_timesteps, cfg_value)
        return patch.transpose(1, 2)

    def stop_logits(self, lm_hidden: torch.Tensor) -> torch.Tensor:
        return self.stop_head(nn.functional.silu(self.stop_proj(lm_hidden)))

    def advance(self, patch: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                lm_cache: StaticKVCache, res_cache: StaticKVCache) -> StepState:
        """Feed each row's new patch [B, P, D] back at cache ``positions``: the next step's state."""
        embed = self.enc_to_lm_proj(self.feat_encoder(patch.unsqueeze(1)))[:, 0, :]
        lm_hidden = self.fsq_layer(self.base_lm.forward_step(embed, positions, slots, lm_cache))
        residual_in = self.fusion_concat_proj(torch.cat((lm_hidden, embed), dim=-1))
        residual_hidden = self.residual_lm.forward_step(residual_in, positions, slots, res_cache)
        return StepState(lm_hidden, residual_hidden, patch)


def load_model(path: str, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
               ) -> tuple[VoxCPM2, AudioVAE]:
    """The language model (in ``dtype``, default the config's) and the AudioVAE (float32) from a
    checkpoint folder in the released layout."""
    config = load_config(path)
    if dtype is None:
        dtype = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
                 "fp16": torch.float16}.get(config.dtype, torch.float32)
    model = VoxCPM2(config)
    _load_strict(model, *_weights(path, "model.safetensors", "pytorch_model.bin"))
    # the rope tables follow the model's dtype, as the reference's buffers do
    return model.to(device=device, dtype=dtype).eval(), load_audio_vae(path, config).to(device=device)


def load_audio_vae(path: str, config: VoxCPM2Config | None = None) -> AudioVAE:
    """The checkpoint's AudioVAE, float32 on the CPU."""
    vae = AudioVAE((config or load_config(path)).audio_vae_config)
    _load_strict(vae, *_weights(path, "audiovae.safetensors", "audiovae.pth"))
    return vae.to(torch.float32).eval()


def _weights(path: str, safetensors_name: str, torch_name: str) -> tuple[dict, str]:
    """A state dict and the file it came from, found as the reference finds it: the safetensors
    file, else the PyTorch one (a ``{"state_dict": ...}`` wrapper unwrapped). The released VoxCPM2
    ships ``model.safetensors`` beside ``audiovae.pth``."""
    file = os.path.join(path, safetensors_name)
    if os.path.exists(file):
        from safetensors.torch import load_file

        return load_file(file), safetensors_name
    file = os.path.join(path, torch_name)
    if not os.path.exists(file):
        raise FileNotFoundError(f"{path}: no {safetensors_name} or {torch_name}")
    state = torch.load(file, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{file}: expected a state dict of tensors")
    return state, torch_name


def _load_strict(module: nn.Module, state: dict, file: str) -> None:
    own = module.state_dict()
    if "decoder.sr_bin_boundaries" in own and "decoder.sr_bin_boundaries" not in state:
        state["decoder.sr_bin_boundaries"] = own["decoder.sr_bin_boundaries"]
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(f"{file}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    module.load_state_dict(state)
