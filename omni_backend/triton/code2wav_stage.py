"""Stage model for a codec decoder ("code2wav"): stateless windows, Triton dynamic batching.

Each request is one window, CODES [num_quantizers, frames] (LEFT_CONTEXT context frames, then
new frames; a window of no frames answers with no audio: the entry's liveness ping); the answer
is the audio of the new frames, AUDIO [new frames * hop_length]: the
decoder skips the work whose only use is context audio. Windows of equal length and context from
different streams arrive here batched by Triton's dynamic batcher. Always Float32.
"""
from __future__ import annotations

import json
import logging
import os

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from omni_backend.deploy import parse_deploy
from omni_backend.pipeline import get_pipeline
from omni_backend.triton import stub_process

logger = logging.getLogger(__name__)


class Code2WavStage:
    def initialize(self, args: dict) -> None:
        stub_process.start_orphan_guard()
        stub_process.start_heartbeat()
        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        pipeline = get_pipeline(params["pipeline"])
        stage_id = int(params["stage_id"])
        deploy = parse_deploy(json.loads(params["deploy"]), f"{args['model_name']}/config.pbtxt")
        sd = deploy.stage(stage_id)
        torch.set_num_threads(sd.threads)
        self.decoder = self.load_decoder(pipeline.model_type, params.get("model") or pipeline.default_model,
                                         sd.device)
        # By default on CPU, decode each window alone so a stream's audio never depends on what it
        # was batched with (bit-identical to serving it solo); GPUs batch for throughput.
        self.decoder.batch_invariant = sd.exact_batches
        self.decode_window = self.decoder.decode_window
        if self.decoder.device.type == "cuda" and not sd.enforce_eager:
            self.decode_window = self.capture_graphs(deploy, sd)

    def capture_graphs(self, deploy, sd):
        """CUDA graphs of every full window shape of the deploy's chunk schedule per batch bucket,
        captured here, before Triton reports the model ready; other shapes run eagerly."""
        from omni_backend.chunking import CodecChunkSchedule
        from omni_backend.engine.cuda_graphs import bucket_sizes
        from omni_backend.models.qwen3_tts.code2wav import Code2WavGraphs

        a = deploy.async_chunk
        schedule = CodecChunkSchedule(a.initial_chunk_frames, a.chunk_frames, a.left_context_frames)
        graphs = Code2WavGraphs(self.decoder, windows=schedule.full_window_shapes(),
                                batch_sizes=bucket_sizes(sd.cuda_graph_sizes, sd.max_batch_size))
        try:
            graphs.capture()
        except Exception:  # serve eagerly rather than not at all
            logger.exception("code2wav CUDA graph capture failed; decoding eagerly")
            return self.decoder.decode_window
        logger.info("code2wav: %d CUDA graphs captured", len(graphs.graphs))
        return graphs.decode_window

    @staticmethod
    def load_decoder(model_type: str, model: str, device: str):
        if model_type == "qwen3_tts":
            from omni_backend.models.qwen3_tts.builtin import resolve_checkpoint
            from omni_backend.models.qwen3_tts.code2wav import Code2Wav

            path = resolve_checkpoint(model)
            return Code2Wav.from_checkpoint(os.path.join(path, "speech_tokenizer"), device=device)
        raise ValueError(f"no codec decoder for model type {model_type!r}")

    def execute(self, requests: list) -> list:
        groups: dict[tuple, list[int]] = {}
        windows = []
        for i, request in enumerate(requests):
            codes = pb_utils.get_input_tensor_by_name(request, "CODES").as_numpy()
            codes = codes.reshape(-1 if codes.size else 1, *codes.shape[-2:])  # [batch, q, frames]
            left = pb_utils.get_input_tensor_by_name(request, "LEFT_CONTEXT").as_numpy().reshape(-1)
            if len(set(left.tolist())) != 1:  # a client batching windows of different contexts
                windows.append(None)
                groups.setdefault(("bad",), []).append(i)
                continue
            if codes.shape[-1] == 0:  # an empty window (the entry's liveness ping): no audio
                windows.append(None)
                groups.setdefault(("empty",), []).append(i)
                continue
            windows.append(codes)
            groups.setdefault((codes.shape[1:], int(left[0])), []).append(i)
        responses: list = [None] * len(requests)
        for key, members in groups.items():
            if key == ("empty",):
                for i in members:
                    responses[i] = pb_utils.InferenceResponse(
                        output_tensors=[pb_utils.Tensor("AUDIO", np.zeros((1, 0), np.float32))])
                continue
            if key == ("bad",):
                for i in members:
                    responses[i] = pb_utils.InferenceResponse(error=pb_utils.TritonError(
                        "invalid_request: LEFT_CONTEXT: one value per request batch"))
                continue
            try:
                batch = torch.from_numpy(np.concatenate([windows[i] for i in members]).astype(np.int64))
                with torch.inference_mode():
                    audio = self.decode_window(batch, key[1]).float().cpu().numpy()
                row = 0
                for i in members:
                    n = windows[i].shape[0]
                    responses[i] = pb_utils.InferenceResponse(
                        output_tensors=[pb_utils.Tensor("AUDIO", np.ascontiguousarray(audio[row:row + n]))])
                    row += n
            except Exception as e:  # a bad window fails its own requests only
                for i in members:
                    responses[i] = pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"internal: code2wav: {type(e).__name__}: {e}"))
        return responses

    def finalize(self) -> None:
        stub_process.exit_after_finalize()
