"""Reference recordings -> voice-clone prompts for ``base`` checkpoints.

:class:`VoiceEncoder` holds the two encoders of a checkpoint (speech tokenizer encoder for the
reference codes, ECAPA-TDNN for the x-vector) and turns a recording into a
:class:`VoiceClonePrompt`, as the reference ``create_voice_clone_prompt`` does: the recording is
mixed to mono, resampled to 24 kHz when needed, encoded to codes (ICL mode only) and to an
x-vector (both modes).

Uploaded bytes are read and checked by :func:`omni_backend.reference_audio.decode_reference_audio`.
"""
from __future__ import annotations

import os
from typing import Optional

import numpy as np
import torch

from omni_backend.reference_audio import resample

from .prompt import PromptError, VoiceClonePrompt
from .speaker_encoder import SPEAKER_SAMPLE_RATE, SpeakerEncoder
from .speech_encoder import SpeechEncoder

__all__ = ["VoiceEncoder"]


class VoiceEncoder:
    """The two encoders of a ``base`` checkpoint; :meth:`encode` -> :class:`VoiceClonePrompt`."""

    def __init__(self, speech_encoder: SpeechEncoder, speaker_encoder: SpeakerEncoder) -> None:
        self.speech_encoder = speech_encoder
        self.speaker_encoder = speaker_encoder

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str, speaker_encoder_config: dict,
                        device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> "VoiceEncoder":
        return cls(SpeechEncoder.from_checkpoint(os.path.join(checkpoint_dir, "speech_tokenizer"), device=device),
                   SpeakerEncoder.from_checkpoint(checkpoint_dir, speaker_encoder_config, device=device, dtype=dtype))

    def encode_audio(self, audio: np.ndarray, sample_rate: int,
                     with_codes: bool = True) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(x-vector ``[hidden]``, reference codes ``[frames, 16]`` or None) of a recording."""
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim > 1:
            audio = audio.mean(axis=-1).astype(np.float32)
        audio_24k = resample(audio, int(sample_rate), SPEAKER_SAMPLE_RATE)
        codes = self.speech_encoder.encode(audio_24k) if with_codes else None
        return self.speaker_encoder.embed(audio_24k), codes

    def encode(self, audio: np.ndarray, sample_rate: int, ref_text: Optional[str] = None,
               x_vector_only: bool = False) -> VoiceClonePrompt:
        if not x_vector_only and (ref_text is None or not str(ref_text).strip()):
            raise PromptError("ref_text", "required for in-context voice cloning (the transcript of ref_audio), "
                                          "unless x_vector_only_mode is true")
        xvector, codes = self.encode_audio(audio, sample_rate, with_codes=not x_vector_only)
        return VoiceClonePrompt(speaker_embedding=xvector, ref_codes=codes, x_vector_only=bool(x_vector_only),
                                ref_text=None if x_vector_only else str(ref_text))
