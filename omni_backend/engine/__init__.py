"""The AR engine (Triton-free): requests keyed by id, admission up to ``max_num_seqs``, a static
per-slot KV cache, one batched step per frame, greedy and seeded sampling, cancellation.

Model-specific step logic lives in a :class:`ModelRunner` next to the model (e.g.
``omni_backend.models.qwen3_tts.runner``).
"""
from .ar_engine import AREngine, DuplicateRequestError
from .async_engine import AsyncEngine, EngineClosedError, FrameStream
from .kv_cache import StaticKVCache
from .model_runner import ModelRunner, StepOutput
from .scheduler import Scheduler
from .sequence import FrameEvent, SamplingParams, SamplingParamsError, Sequence, SequenceStatus

__all__ = [
    "AREngine", "AsyncEngine", "DuplicateRequestError", "EngineClosedError", "FrameEvent", "FrameStream",
    "ModelRunner", "SamplingParams", "SamplingParamsError", "Scheduler", "Sequence", "SequenceStatus",
    "StaticKVCache", "StepOutput",
]
