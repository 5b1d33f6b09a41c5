"""The backbone's input for one request (``voxcpm``'s ``_generate_with_prompt_cache``), in the
reference's three cloning modes:

- zero-shot: text tokens ending in ``<|audio_start|>`` (id 101);
- ``continuation``: a recording's transcript before the text, the recording's latent patches
  after ``<|audio_start|>`` (the speech goes on from the recording);
- ``reference``: the recording's patches between ``<|ref_audio_start|>`` (103) and
  ``<|ref_audio_end|>`` (104) before the text (its voice, not its words);
- ``ref_continuation``: both.

Also the prompt cache of a recording: its latent patches, encoded once (padded on the left to whole
patches for continuation, on the right for a reference).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from .audio_vae import AudioVAE

AUDIO_START_TOKEN = 101
REF_AUDIO_START_TOKEN, REF_AUDIO_END_TOKEN = 103, 104
CLONE_MODES = ("continuation", "reference", "ref_continuation")


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


def controlled_text(text: str, instructions: str | None) -> str:
    """The text the model reads for a voice description (VoxCPM2's voice design, and a reference
    clone's style): the description in parentheses before the text, as the package's CLI builds it
    (``--control``); a blank description adds nothing."""
    control = (instructions or "").strip()
    return f"({control}){text}" if control else text


def build_prompt(tokenize, text: str, patch_size: int, feat_dim: int, prompt_text: str = "",
                 prompt_feat: torch.Tensor | None = None, ref_feat: torch.Tensor | None = None,
                 streaming_prefix_len: int = 4) -> Prompt:
    """Zero-shot, or cloning (module doc): ``prompt_feat`` [N, P, D] with its transcript
    ``prompt_text`` for continuation, ``ref_feat`` [M, P, D] for a reference, or both."""
    text = normalize_whitespace(text)
    full = (prompt_text + text) if prompt_feat is not None else text
    parts: list[tuple[torch.Tensor, torch.Tensor, bool]] = []    # (token ids, feats, is audio)

    def words(ids: list[int]) -> None:
        parts.append((torch.LongTensor(ids), torch.zeros((len(ids), patch_size, feat_dim)), False))

    def audio(feat: torch.Tensor) -> None:
        parts.append((torch.zeros(feat.shape[0], dtype=torch.long), feat.to(torch.float32), True))

    if ref_feat is not None:
        words([REF_AUDIO_START_TOKEN])
        audio(ref_feat)
        words([REF_AUDIO_END_TOKEN])
    words(tokenize(full) + [AUDIO_START_TOKEN])
    if prompt_feat is not None:
        audio(prompt_feat)
    text_token = torch.cat([ids for ids, _, _ in parts])
    feat = torch.cat([f for _, f, _ in parts], dim=0)
    feat_mask = torch.cat([torch.full((len(ids),), int(is_audio), dtype=torch.int32) for ids, _, is_audio in parts])
    text_mask = 1 - feat_mask
    # a prompt that ends in audio (continuation) decodes its last audio patches first, a
    # reference's too when the continuation recording is shorter than that
    context_patches: list = []
    if prompt_feat is not None:
        heard = feat[feat_mask.bool()]
        context = min(streaming_prefix_len - 1, heard.shape[0])
        context_patches = [heard[heard.shape[0] - context + i] for i in range(context)]
    return Prompt(text_token, text_mask, feat, feat_mask, context_patches, len(tokenize(text)))


def max_patches(prompt: Prompt, max_len: int, ratio: float = 6.0) -> int:
    """The reference's bound on generated patches: ``min(int(target tokens * 6 + 10), max_len)``."""
    return min(int(prompt.target_text_length * ratio + 10), max_len)


def encode_recording(vae: AudioVAE, audio: torch.Tensor, patch_size: int, pad: str = "left") -> torch.Tensor:
    """A mono recording at the VAE's ``sample_rate`` [samples] -> its latent patches [N, P, D],
    zero-padded to whole patches on the ``pad`` side (``left`` for continuation, ``right`` for a
    reference, as the reference's ``_encode_wav``)."""
    patch_len = patch_size * vae.config.hop_length
    audio = audio.reshape(1, -1).to(torch.float32)
    if audio.size(1) % patch_len:
        extra = patch_len - audio.size(1) % patch_len
        audio = torch.nn.functional.pad(audio, (extra, 0) if pad == "left" else (0, extra))
    with torch.inference_mode():
        feat = vae.encode(audio)
    d = vae.config.latent_dim
    return feat.view(d, -1, patch_size).permute(1, 2, 0).contiguous()
