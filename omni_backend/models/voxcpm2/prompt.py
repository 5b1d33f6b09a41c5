"""The backbone's input for one request (``voxcpm``'s ``_generate_with_prompt_cache``): text tokens
ending in ``<|audio_start|>`` (id 101), then, when cloning from a recording with its transcript
(continuation), the recording's latent patches, with the transcript before the target text.
Also the prompt cache of a recording: its latent patches, encoded once."""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from .audio_vae import AudioVAE

AUDIO_START_TOKEN = 101


@dataclass(frozen=True)
class Prompt:
    text_token: torch.Tensor     # [T] long
    text_mask: torch.Tensor      # [T] int32
    feat: torch.Tensor           # [T, P, D] float32
    feat_mask: torch.Tensor      # [T] int32
    context_patches: list        # the recording's last patches, decoded before the new ones (list of [P, D])
    target_text_length: int      # tokens of the target text alone (the reference's max_len bound)

    def __len__(self) -> int:
        return int(self.text_token.shape[0])


def normalize_whitespace(text: str) -> str:
    """The package's ``VoxCPM.generate`` speaks the target text with every run of whitespace
    (newlines included) made one space; the transcript of a recording is taken as it is."""
    return re.sub(r"\s+", " ", text.replace("\n", " "))


def build_prompt(tokenize, text: str, patch_size: int, feat_dim: int, prompt_text: str = "",
                 prompt_feat: torch.Tensor | None = None, streaming_prefix_len: int = 4) -> Prompt:
    """Zero-shot (``prompt_feat`` None) or continuation (a recording's patches [N, P, D] and its
    transcript ``prompt_text``)."""
    text = normalize_whitespace(text)
    full = (prompt_text + text) if prompt_feat is not None else text
    tokens = torch.LongTensor(tokenize(full) + [AUDIO_START_TOKEN])
    n_text = tokens.shape[0]
    audio = prompt_feat if prompt_feat is not None else torch.empty((0, patch_size, feat_dim))
    n_audio = audio.shape[0]
    text_token = torch.cat([tokens, torch.zeros(n_audio, dtype=torch.long)])
    feat = torch.cat([torch.zeros((n_text, patch_size, feat_dim)), audio.to(torch.float32)], dim=0)
    text_mask = torch.cat([torch.ones(n_text, dtype=torch.int32), torch.zeros(n_audio, dtype=torch.int32)])
    feat_mask = torch.cat([torch.zeros(n_text, dtype=torch.int32), torch.ones(n_audio, dtype=torch.int32)])
    context = min(streaming_prefix_len - 1, n_audio) if n_audio else 0
    context_patches = [audio[n_audio - context + i] for i in range(context)]
    return Prompt(text_token, text_mask, feat, feat_mask, context_patches, len(tokenize(text)))


def max_patches(prompt: Prompt, max_len: int, ratio: float = 6.0) -> int:
    """The reference's bound on generated patches: ``min(int(target tokens * 6 + 10), max_len)``."""
    return min(int(prompt.target_text_length * ratio + 10), max_len)


def encode_recording(vae: AudioVAE, audio: torch.Tensor, patch_size: int) -> torch.Tensor:
    """A mono recording at the VAE's ``sample_rate`` [samples] -> its latent patches [N, P, D],
    padded on the left to whole patches (the reference's continuation prompt)."""
    patch_len = patch_size * vae.config.hop_length
    audio = audio.reshape(1, -1).to(torch.float32)
    if audio.size(1) % patch_len:
        audio = torch.nn.functional.pad(audio, (patch_len - audio.size(1) % patch_len, 0))
    with torch.inference_mode():
        feat = vae.encode(audio)
    d = vae.config.latent_dim
    return feat.view(d, -1, patch_size).permute(1, 2, 0).contiguous()
