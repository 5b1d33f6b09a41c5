"""The AR engine (Triton-free): requests keyed by id, admission up to ``max_num_seqs``, a static
per-slot KV cache, one batched step per frame, greedy and seeded sampling, cancellation, and the
stop rules (eos, max_new_tokens, max_model_len, min_new_tokens).

Model-specific step logic lives in a :class:`ModelRunner` in the model family's folder
(``omni_backend/models/<family>/``); the engine names no model.
"""
from .ar_engine import AREngine, DuplicateRequestError
from .async_engine import AsyncEngine, EngineClosedError, FrameStream
from .kv_cache import StaticKVCache
from .model_runner import ModelRunner, StepOutput
from .scheduler import Scheduler
from .sequence import (FrameEvent, PromptTooLongError, SamplingParams, SamplingParamsError, Sequence, SequenceStatus,
                       check_warp)

__all__ = [
    "AREngine", "AsyncEngine", "DuplicateRequestError", "EngineClosedError", "FrameEvent", "FrameStream",
    "ModelRunner", "PromptTooLongError", "SamplingParams", "SamplingParamsError", "Scheduler", "Sequence",
    "SequenceStatus", "StaticKVCache", "StepOutput", "check_warp",
]
