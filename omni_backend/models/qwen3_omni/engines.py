"""The AR engines of Qwen3-Omni's thinker and talker stages, in either batch mode: ``exact``
(:mod:`.thinker_runner`, :mod:`.talker_runner`) or ``throughput`` (:mod:`.throughput_runner`,
whose runners subclass the exact ones, so the choice between them lives above both)."""
from __future__ import annotations

from typing import Optional

import torch

from omni_backend.engine import AREngine, SamplingParams

from .checkpoint import Qwen3OmniCheckpoint
from .talker import Talker
from .talker_runner import talker_sampling_defaults
from .throughput_runner import runner_class_for

__all__ = ["create_thinker_engine", "create_talker_engine"]


def create_thinker_engine(checkpoint: Qwen3OmniCheckpoint, max_num_seqs: int = 8, max_model_len: int = 4096,
                          eos_token_ids: Optional[frozenset[int]] = None, max_prefills_per_step: int = 1,
                          num_threads: Optional[int] = None,
                          default_params: Optional[SamplingParams] = None, batch_mode: str = "exact",
                          cuda_graph_sizes: Optional[list[int]] = None, enforce_eager: bool = False,
                          static_step: Optional[bool] = None) -> AREngine:
    """An engine over a loaded checkpoint's thinker; eos defaults to ``<|im_end|>`` (the
    reference's answer end). The default sampling is greedy without a repetition penalty.
    ``batch_mode``: ``exact`` (each sequence alone, bit-exact) or ``throughput`` (the rows of a
    decode step share forward passes, :mod:`.throughput_runner`; on CUDA its steps are captured as CUDA
    graphs per ``cuda_graph_sizes`` bucket unless ``enforce_eager``; ``static_step`` forces or
    refuses the static-buffer step whatever the device)."""
    if num_threads is not None:
        torch.set_num_threads(int(num_threads))
    eos = eos_token_ids if eos_token_ids is not None else frozenset({checkpoint.config.im_end_token_id})
    runner_class = runner_class_for("thinker", batch_mode)
    options = {} if batch_mode == "exact" else {"graph_sizes": cuda_graph_sizes, "enforce_eager": enforce_eager,
                                                "static_step": static_step}
    runner = runner_class(checkpoint.thinker, eos, max_num_seqs, max_model_len, checkpoint.config,
                          checkpoint.audio_tower, checkpoint.visual, **options)
    params = default_params or SamplingParams(do_sample=False, repetition_penalty=1.0, top_k=0, top_p=1.0,
                                              temperature=1.0, max_new_tokens=1024, min_new_tokens=0)
    return AREngine(runner, max_prefills_per_step=max_prefills_per_step, num_threads=num_threads,
                    default_params=params)


def create_talker_engine(talker: Talker, max_num_seqs: int = 8, max_model_len: int = 4096,
                         max_prefills_per_step: int = 1, num_threads: Optional[int] = None,
                         default_params: Optional[SamplingParams] = None,
                         max_input_wait_s: Optional[float] = None, batch_mode: str = "exact",
                         cuda_graph_sizes: Optional[list[int]] = None, enforce_eager: bool = False,
                         static_step: Optional[bool] = None) -> AREngine:
    """``batch_mode``: ``exact`` (each sequence alone, bit-exact) or ``throughput`` (the rows of a
    decode step share forward passes, :mod:`.throughput_runner`; on CUDA its steps are captured as CUDA
    graphs per ``cuda_graph_sizes`` bucket unless ``enforce_eager``; ``static_step`` forces or
    refuses the static-buffer step whatever the device)."""
    runner_class = runner_class_for("talker", batch_mode)
    options = {} if batch_mode == "exact" else {"graph_sizes": cuda_graph_sizes, "enforce_eager": enforce_eager,
                                                "static_step": static_step}
    runner = runner_class(talker, max_num_seqs, max_model_len, **options)
    return AREngine(runner, max_prefills_per_step=max_prefills_per_step, num_threads=num_threads,
                    default_params=default_params or talker_sampling_defaults(),
                    max_input_wait_s=max_input_wait_s)
