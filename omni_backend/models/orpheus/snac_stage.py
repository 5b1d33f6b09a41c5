"""Orpheus's codec stage: SNAC 24 kHz windows -> audio, batched across streams, Float32.

Each request is one window, CODES [28] (4 frames of 7 codes) and NOISE_SEED [1]; the answer is
the audio of the window's second frame, AUDIO [frame_samples] (2048 samples at 24 kHz). Windows
of different streams arrive together through Triton's dynamic batcher. On CPU (batch_invariant,
the default there) each window is decoded alone, so a stream's audio never depends on what it was
batched with.
"""
from __future__ import annotations

from typing import Hashable

import numpy as np
import torch

from omni_backend.errors import InvalidRequest
from omni_backend.triton.batched_stage import BatchedStage, Inputs

from .builtin import resolve_checkpoint, snac_folder
from .snac import load_snac
from .tokens import CODEBOOK_SIZE, FRAME_TOKENS, WINDOW_FRAMES, window_codebooks


class SnacStage(BatchedStage):
    def load(self) -> None:
        sd = self.stage_deploy
        torch.set_num_threads(sd.threads)
        folder = snac_folder(resolve_checkpoint(self.model_path), sd.options.get("snac_path"))
        self.device = torch.device(sd.device)
        self.snac = load_snac(folder, device=self.device)
        self.rows_alone = bool(sd.batch_invariant)

    def batch_key(self, inputs: Inputs) -> Hashable:
        codes = inputs["CODES"]
        if codes.shape[1:] != (FRAME_TOKENS * WINDOW_FRAMES,):
            raise InvalidRequest("CODES", f"a window is {FRAME_TOKENS * WINDOW_FRAMES} codes, got {codes.shape[1:]}")
        if codes.size and (codes.min() < 0 or codes.max() >= CODEBOOK_SIZE):
            raise InvalidRequest("CODES", f"codes must be in [0, {CODEBOOK_SIZE})")
        return codes.shape[1:]

    def _decode(self, windows: np.ndarray, seeds: list[int]) -> np.ndarray:
        device = self.device
        books = [torch.from_numpy(np.ascontiguousarray(c)).to(device) for c in window_codebooks(windows)]
        with torch.inference_mode():
            audio = self.snac.decode(books, seeds)
        n = self.snac.frame_samples
        return audio[:, 0, n:2 * n].float().cpu().numpy()

    def run_batch(self, batch: list[Inputs]) -> list[dict[str, np.ndarray]]:
        windows = np.concatenate([b["CODES"] for b in batch]).astype(np.int64)
        seeds = [int(s) for b in batch for s in b["NOISE_SEED"].reshape(-1)]
        if self.rows_alone:
            audio = np.concatenate([self._decode(windows[i:i + 1], seeds[i:i + 1]) for i in range(len(seeds))])
        else:
            audio = self._decode(windows, seeds)
        out, row = [], 0
        for b in batch:
            n = b["CODES"].shape[0]
            out.append({"AUDIO": audio[row:row + n]})
            row += n
        return out
