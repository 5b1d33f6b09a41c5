"""Qwen3-TTS's codec decoder ("code2wav") as a batched stage: stateless windows.

Each request is one window, CODES [num_quantizers, frames] (LEFT_CONTEXT context frames, then
new frames); the answer is the audio of the new frames, AUDIO [new frames * hop_length]: the
decoder skips the work whose only use is context audio. Windows of equal length and context from
different streams arrive batched by Triton's dynamic batcher. Always Float32.
"""
from __future__ import annotations

import os
from typing import Hashable

import numpy as np
import torch

from omni_backend.errors import InvalidRequest
from omni_backend.triton.batched_stage import BatchedStage, Inputs


class Code2WavStage(BatchedStage):
    def load(self) -> None:
        from omni_backend.models.qwen3_tts.builtin import resolve_checkpoint
        from omni_backend.models.qwen3_tts.code2wav import Code2Wav

        sd = self.stage_deploy
        torch.set_num_threads(sd.threads)
        path = resolve_checkpoint(self.model_path)
        self.decoder = Code2Wav.from_checkpoint(os.path.join(path, "speech_tokenizer"), device=sd.device)
        # By default on CPU, decode each window alone so a stream's audio never depends on what it
        # was batched with (bit-identical to serving it solo); GPUs batch for throughput.
        self.decoder.batch_invariant = sd.batch_invariant
        self.decode_window = self.decoder.decode_window
        if self.decoder.device.type == "cuda" and not sd.enforce_eager:
            self.decode_window = self.capture_graphs()

    def capture_graphs(self):
        """CUDA graphs of every full window shape of the deploy's chunk schedule per batch bucket,
        captured here, before Triton reports the model ready; other shapes run eagerly."""
        from omni_backend.engine.cuda_graphs import bucket_sizes
        from omni_backend.models.qwen3_tts.code2wav import captured_window_decoder

        sd = self.stage_deploy
        return captured_window_decoder(self.decoder, self.deploy.async_chunk.chunk_schedule().full_window_shapes(),
                                       bucket_sizes(sd.cuda_graph_sizes, sd.max_batch_size))

    def batch_key(self, inputs: Inputs) -> Hashable:
        codes, left = inputs["CODES"], inputs["LEFT_CONTEXT"].reshape(-1)
        if len(set(left.tolist())) != 1:  # a client batching windows of different contexts
            raise InvalidRequest("LEFT_CONTEXT", "one value per request batch")
        return codes.shape[1:], int(left[0])

    def run_batch(self, batch: list[Inputs]) -> list[dict[str, np.ndarray]]:
        windows = [b["CODES"] for b in batch]
        left = int(batch[0]["LEFT_CONTEXT"].reshape(-1)[0])
        codes = torch.from_numpy(np.concatenate(windows).astype(np.int64))
        with torch.inference_mode():
            audio = self.decode_window(codes, left).float().cpu().numpy()
        out, row = [], 0
        for w in windows:
            out.append({"AUDIO": audio[row:row + w.shape[0]]})
            row += w.shape[0]
        return out
