"""Stage ``vae`` of VoxCPM2: the AudioVAE decoder on stateless windows, Float32, batched across
streams by Triton's dynamic batcher.

Each request is one window (:mod:`.vae_windows`): LATENTS [D, left + new] latent frames and
LEFT_CONTEXT [1] = left; the answer is the new frames' audio, AUDIO [new * decode_hop_length].
The decoder is causal with a finite reach (:func:`.audio_vae.decoder_left_context`), so with
that much context (or from the stream's start) a window's audio is the whole decode's. Windows of
equal shape are decoded together; on CPU each alone by default (``batch_invariant``), so a
stream's audio never depends on what it was batched with.
"""
from __future__ import annotations

from typing import Hashable

import numpy as np
import torch

from omni_backend.errors import InvalidRequest
from omni_backend.triton.batched_stage import BatchedStage, Inputs

from .builtin import resolve_checkpoint


class VAEStage(BatchedStage):
    def load(self) -> None:
        from .config import load_config
        from .model import load_audio_vae

        sd = self.stage_deploy
        torch.set_num_threads(sd.threads)
        path = resolve_checkpoint(self.model_path)
        config = load_config(path)
        vae = load_audio_vae(path, config)
        cfg = config.audio_vae_config
        self.device = torch.device(sd.device)
        self.vae = vae.to(self.device, torch.float32).eval()
        self.hop = cfg.decode_hop_length
        self.latent_dim = cfg.latent_dim
        self.batch_invariant = sd.batch_invariant

    def batch_key(self, inputs: Inputs) -> Hashable:
        latents = inputs["LATENTS"]
        if latents.ndim != 3 or latents.shape[1] != self.latent_dim:
            raise InvalidRequest("LATENTS", f"a window is [{self.latent_dim}, frames], got {latents.shape[1:]}")
        left = inputs["LEFT_CONTEXT"].reshape(-1)
        if len(set(left.tolist())) != 1:
            raise InvalidRequest("LEFT_CONTEXT", "one context per request batch")
        left = int(left[0])
        if not 0 <= left < latents.shape[-1]:
            raise InvalidRequest("LEFT_CONTEXT", f"{left} leaves no new frame of {latents.shape[-1]}")
        if not np.isfinite(latents).all():
            raise InvalidRequest("LATENTS", "contains non-finite values")
        return latents.shape[1:], left

    def _decode(self, latents: np.ndarray, left: int) -> np.ndarray:
        with torch.inference_mode():
            audio = self.vae.decode(torch.from_numpy(np.ascontiguousarray(latents, dtype=np.float32)).to(self.device))
        return audio[:, 0, left * self.hop:].float().cpu().numpy()

    def run_batch(self, batch: list[Inputs]) -> list[dict[str, np.ndarray]]:
        _, left = self.batch_key(batch[0])
        windows = [b["LATENTS"] for b in batch]
        if self.batch_invariant:
            return [{"AUDIO": self._decode(w, left)} for w in windows]
        audio = self._decode(np.concatenate(windows), left)
        out, row = [], 0
        for w in windows:
            out.append({"AUDIO": audio[row:row + w.shape[0]]})
            row += w.shape[0]
        return out
