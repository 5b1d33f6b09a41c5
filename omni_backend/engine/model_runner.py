"""What the engine needs from a model: the runner interface.

A runner owns the model, its static caches (indexed by the slot the scheduler gives each
sequence) and the per-sequence model state (``seq.state``). The engine owns everything else:
request bookkeeping, admission, cancellation and the event stream. A multi-codebook model
(Qwen3-TTS, CSM, ...) produces one frame per sequence per ``decode`` call.

For CUDA graphs, a runner keeps its decode inputs in static buffers sized ``max_num_seqs`` and
captures its step per batch-size bucket (:class:`~omni_backend.engine.cuda_graphs.GraphBuckets`);
the interface does not change.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Optional

from .sequence import SamplingParams, Sequence

__all__ = ["ModelRunner", "StepOutput"]


@dataclass
class StepOutput:
    """One sequence's result of a prefill or decode call: a frame (``codes``) and/or the end."""

    seq: Sequence
    codes: Optional[list[int]]
    finished: bool = False
    finish_reason: Optional[str] = None


class ModelRunner(abc.ABC):
    max_num_seqs: int

    def check(self, prompt: Any, params: SamplingParams) -> None:
        """Raise a ``ValueError`` (an ``InvalidRequest``) if the request cannot run at all, e.g. its
        prompt does not fit the cache. Called when the request is added."""

    @abc.abstractmethod
    def prefill(self, seq: Sequence) -> Optional[StepOutput]:
        """Run the prompt of a newly admitted sequence into its slot. Returns an output only if
        the sequence ends right away (it then yields no frame)."""

    def prefill_many(self, seqs: list[Sequence]) -> list[Optional[StepOutput]]:
        """Prefill the sequences admitted in one step (one output or None each, in order). A
        runner may run them together; if this raises, the engine prefills them one by one."""
        return [self.prefill(seq) for seq in seqs]

    @abc.abstractmethod
    def decode(self, seqs: list[Sequence]) -> list[StepOutput]:
        """Advance every sequence by one frame (one output per sequence, in order)."""

    def release(self, seq: Sequence) -> None:
        """Drop the model state of a finished or cancelled sequence."""
        seq.state = None
