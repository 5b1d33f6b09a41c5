"""Codes with CUDA graphs equal codes of the same step run eagerly, greedy and sampled.

:func:`greedy_graph_parity` builds two engines on one checkpoint and device, one replaying
CUDA graphs and one with ``enforce_eager`` (the same
:class:`~omni_backend.models.qwen3_tts.static_step.GraphSafeStaticStep` without graphs),
runs the same requests through both at each concurrency (greedy ones, and seeded sampled ones:
the sampling noise is a function of seed and frame, so it must match too), and compares every
frame. On a CPU it runs both engines eagerly (``static_step=True``), which checks the plumbing
but not the graphs; ``perf/gpu/check.py`` calls it on the GPU.
"""
from __future__ import annotations

import time
from typing import Iterable, Optional

import torch

from omni_backend.engine import SamplingParams

from omni_backend.models.qwen3_tts.checkpoint import Qwen3TTSCheckpoint, load_checkpoint
from omni_backend.models.qwen3_tts.runner import create_engine
from omni_backend.models.qwen3_tts.sampling_params import Qwen3SamplingParams

__all__ = ["greedy_graph_parity", "PARITY_TEXTS"]

PARITY_TEXTS = ["Hello world, this is a streaming test.", "你好，世界。今天天气很好。",
                "The quick brown fox jumps over the lazy dog.", "How are you doing today?",
                "Numbers 1 2 3 and symbols.", "Bonjour tout le monde.",
                "A much longer sentence with many more tokens than the others.", "Short one."]


def _requests(checkpoint: Qwen3TTSCheckpoint, count: int, frames: int, tag: str, sample: bool = False) -> list:
    builder = checkpoint.prompt_builder()
    speakers = list(builder.speakers) or [None]
    instruct = None if checkpoint.config.tts_model_type == "custom_voice" else "A calm, clear voice."
    out = []
    for i in range(count):
        prompt = builder.build(PARITY_TEXTS[i % len(PARITY_TEXTS)], speaker=speakers[i % len(speakers)],
                               instruct=instruct)
        if sample:  # the in-graph noise, top-k and top-p (every other request) paths
            params = SamplingParams(max_new_tokens=frames + 1 + i % 3, seed=1000 + i, top_p=0.9 if i % 2 else 1.0,
                                    extra=Qwen3SamplingParams(subtalker_top_p=0.9 if i % 2 else 1.0))
        else:
            params = SamplingParams.greedy(max_new_tokens=frames + 1 + i % 3, repetition_penalty=1.05)
        out.append((f"{tag}{i}", prompt, params))
    return out


def greedy_graph_parity(checkpoint: Qwen3TTSCheckpoint | str, device: str = "cuda", dtype: str | torch.dtype = "bfloat16",
                        concurrency: Iterable[int] = (1, 3, 4), frames: int = 24,
                        cuda_graph_sizes: Optional[Iterable[int]] = None, max_model_len: int = 512,
                        sample_concurrency: Iterable[int] = (), shortest_attention: int = 16) -> dict:
    """Returns ``{"ok": bool, "levels": [{"concurrency", "sample", "frames", "equal", "first_mismatch"}...],
    "capture_s": seconds}``: greedy at each of ``concurrency``, seeded sampling at each of
    ``sample_concurrency``. Levels that are not a bucket size exercise padding; attention length
    buckets from ``shortest_attention`` (short, so that short requests cross several)."""
    if isinstance(checkpoint, str):
        checkpoint = load_checkpoint(checkpoint, dtype=dtype, device=device)
    levels = [(c, False) for c in concurrency] + [(c, True) for c in sample_concurrency]
    max_seqs = max(c for c, _ in levels)
    sizes = list(cuda_graph_sizes) if cuda_graph_sizes else sorted({1, 2, 4, max_seqs})
    static = checkpoint.device.type != "cuda" or None
    started = time.perf_counter()
    graphed = create_engine(checkpoint, max_num_seqs=max_seqs, max_model_len=max_model_len,
                            cuda_graph_sizes=sizes, static_step=static, max_prefills_per_step=max_seqs,
                            shortest_attention=shortest_attention)
    capture_s = time.perf_counter() - started
    eager = create_engine(checkpoint, max_num_seqs=max_seqs, max_model_len=max_model_len, cuda_graph_sizes=sizes,
                          enforce_eager=True, static_step=static, max_prefills_per_step=max_seqs,
                          shortest_attention=shortest_attention)
    report = {"ok": True, "levels": [], "capture_s": capture_s,
              "graphs": len(getattr(graphed.runner.graphs, "graphs", {}) or {})}
    for c, sample in levels:
        tag = f"c{c}{'s' if sample else ''}-"
        a = graphed.generate(_requests(checkpoint, c, frames, tag, sample))
        b = eager.generate(_requests(checkpoint, c, frames, tag, sample))
        mismatch = None
        for key in sorted(b):
            for index, (x, y) in enumerate(zip(a.get(key, []), b[key])):
                if x != y:
                    mismatch = mismatch or f"{key} frame {index}"
                    break
            if len(a.get(key, [])) != len(b[key]):
                mismatch = mismatch or f"{key}: {len(a.get(key, []))} vs {len(b[key])} frames"
        equal = mismatch is None and set(a) == set(b)
        report["levels"].append({"concurrency": c, "sample": sample, "frames": sum(len(v) for v in b.values()),
                                 "equal": equal, "first_mismatch": mismatch})
        report["ok"] = report["ok"] and equal
    del graphed, eager
    return report
