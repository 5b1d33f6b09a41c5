"""In-process generation of one request (tests, the reference timing beside benchmarks): the
same prefill, side module and step the served runner batches, run for one row.

``generate`` mirrors ``voxcpm``'s ``VoxCPM2Model.generate`` / ``generate_with_prompt_cache``: the
step's patch is kept, then the stop head decides (only after ``min_len`` steps), at most
:func:`~.prompt.max_patches` patches; the latents of the recording's last patches (continuation)
and the new ones are decoded whole and the context's audio is cut.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .audio_vae import AudioVAE
from .local_dit import draw_noise
from .minicpm import StaticKVCache
from .model import VoxCPM2
from .prompt import Prompt, max_patches


@dataclass
class Generation:
    patches: torch.Tensor     # [N, P, D] the generated latent patches
    context: torch.Tensor     # [C, P, D] the recording's patches decoded before them (C may be 0)
    stopped: bool             # the stop head ended it (else max_len)


@torch.inference_mode()
def generate_latents(model: VoxCPM2, prompt: Prompt, seed: int = 0, min_len: int = 2, max_len: int = 2000,
                     inference_timesteps: int = 10, cfg_value: float = 2.0) -> Generation:
    dev = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    limit = max_patches(prompt, max_len)
    n = len(prompt)
    # the reference's static cache length: attention over the same masked length sums alike
    length = max(model.config.max_length, n + limit + 1)
    lm_cache = StaticKVCache(model.config.lm_config, 1, length, dev, dtype)
    res_cache = StaticKVCache(model.config.residual_lm(), 1, length, dev, dtype)
    state, lm_kv, res_kv = model.prefill(prompt.text_token[None].to(dev), prompt.text_mask[None].to(dev),
                                         prompt.feat[None].to(dev, dtype), prompt.feat_mask[None].to(dev))
    lm_cache.fill(0, lm_kv)
    res_cache.fill(0, res_kv)
    generator = torch.Generator().manual_seed(seed)
    cfg = torch.tensor([cfg_value], device=dev)
    slots = torch.zeros(1, dtype=torch.long, device=dev)
    patches, stopped = [], False
    for i in range(limit):
        noise = draw_noise(generator, model.feat_dim, model.patch_size, dtype)[None].to(dev)
        patch = model.side_module(state, noise, inference_timesteps, cfg)
        patches.append(patch[0])
        stop = int(model.stop_logits(state.lm_hidden).argmax(dim=-1)[0])
        if i > min_len and stop == 1:
            stopped = True
            break
        state = model.advance(patch, torch.tensor([n + i], device=dev), slots, lm_cache, res_cache)
    context = torch.stack(prompt.context_patches) if prompt.context_patches else \
        torch.empty((0, model.patch_size, model.feat_dim))
    return Generation(torch.stack(patches).float().cpu(), context.float().cpu(), stopped)


def patches_to_latents(patches: torch.Tensor) -> torch.Tensor:
    """[N, P, D] -> [D, N * P] (the VAE's input layout)."""
    return patches.reshape(-1, patches.shape[-1]).transpose(0, 1).contiguous()


@torch.inference_mode()
def decode_whole(vae: AudioVAE, gen: Generation) -> torch.Tensor:
    """The waveform [samples] of the generated patches, decoded after the context's as the
    reference's non-streaming ``generate`` does."""
    dev = next(vae.parameters()).device
    z = patches_to_latents(torch.cat([gen.context, gen.patches], dim=0))[None].to(dev)
    audio = vae.decode(z)[0, 0]
    cut = gen.context.shape[0] * gen.context.shape[1] * vae.config.decode_hop_length if gen.context.numel() else 0
    return audio[cut:].cpu()
