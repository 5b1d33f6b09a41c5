"""Stage 2 of Qwen3-Omni: code2wav as a batched stage over stateless windows (Float32).

Each request is one window (:mod:`.codec_windows`): CODES [16, frames] = LEFT_CONTEXT frames of
context, the new frames, RIGHT_CONTEXT frames of lookahead. The answer is the new frames' audio:
``new * hop_length`` samples, or with no lookahead the decode's whole tail (``trim`` samples
short, as the reference's chunk ends are). Windows of equal shape from different streams arrive
batched by Triton's dynamic batcher; on CPU each is decoded alone by default, so a stream's
audio never depends on what it was batched with.
"""
from __future__ import annotations

from typing import Hashable

import numpy as np
import torch

from omni_backend.errors import InvalidRequest
from omni_backend.triton.batched_stage import BatchedStage, Inputs

from .config import SPEECHLESS, load_config


class Code2WavStage(BatchedStage):
    def load(self) -> None:
        from .builtin import resolve_checkpoint
        from .checkpoint import load_checkpoint

        sd = self.stage_deploy
        torch.set_num_threads(sd.threads)
        path = resolve_checkpoint(self.model_path)
        self.batch_invariant = sd.batch_invariant
        if load_config(path).talker is None:   # the builder writes no code2wav model for it
            raise ValueError(f"{self.model_name}: {SPEECHLESS}; rebuild the repository")
        self.decoder = load_checkpoint(path, device=sd.device, parts=("code2wav",)).code2wav

    def batch_key(self, inputs: Inputs) -> Hashable:
        codes = inputs["CODES"]
        left, right = inputs["LEFT_CONTEXT"].reshape(-1), inputs["RIGHT_CONTEXT"].reshape(-1)
        if len(set(left.tolist())) != 1 or len(set(right.tolist())) != 1:
            raise InvalidRequest("LEFT_CONTEXT", "one context per request batch")
        left, right = int(left[0]), int(right[0])
        if left < 0 or right < 0 or left + right >= codes.shape[-1]:
            raise InvalidRequest("LEFT_CONTEXT", f"{left} + RIGHT_CONTEXT {right} leave no new frame of "
                                                 f"{codes.shape[-1]}")
        return codes.shape[1:], left, right

    def _decode(self, codes: np.ndarray, left: int, right: int) -> np.ndarray:
        with torch.inference_mode():
            audio = self.decoder.decode_lookahead_window(torch.from_numpy(codes.astype(np.int64)), left, right)
        return audio.float().cpu().numpy()

    def run_batch(self, batch: list[Inputs]) -> list[dict[str, np.ndarray]]:
        _, left, right = self.batch_key(batch[0])
        windows = [b["CODES"] for b in batch]
        if self.batch_invariant:
            return [{"AUDIO": self._decode(w, left, right)} for w in windows]
        audio = self._decode(np.concatenate(windows), left, right)
        out, row = [], 0
        for w in windows:
            out.append({"AUDIO": audio[row:row + w.shape[0]]})
            row += w.shape[0]
        return out
