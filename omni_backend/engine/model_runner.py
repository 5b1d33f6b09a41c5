"""What the engine needs from a model: the runner interface.

A runner owns the model, its static caches (indexed by the slot the scheduler gives each
sequence) and the per-sequence model state (``seq.state``); it only computes steps. The engine
owns everything else: request bookkeeping, admission, cancellation, the event stream, and when a
sequence ends.

The steps, as the engine sees them: ``prefill`` runs a sequence's prompt (``prompt_length``
cache positions) and returns its first token. Each ``decode`` call makes, per sequence, the frame
of its last token and, when ``seq.sample_next``, the next token: it feeds the frame back at cache
position ``prompt_length + frame index``. A frame is whatever one step outputs (several ids for a
multi-codebook model, the token itself for a plain LM). The engine ends a sequence on a token in
``eos_token_ids`` (eos is not a frame), at ``max_new_tokens - max_new_tokens_offset`` frames, or
when the cache has no position left for the next token (``max_model_len``); on a sequence's last
step it sets ``seq.sample_next`` False, so no token is drawn that no frame would use. It sets
``seq.ban_eos`` while fewer than ``min_new_tokens`` tokens exist; the runner masks its eos ids
then.

A runner whose requests can take input while they run (text that arrives in pieces) implements
``extend`` (the engine hands it what arrived, in order, once the request is prefilled) and
``ready`` (whether a request's next step has the input it needs). A request that is not ready
skips steps, holding its slot and cache, while the others go on.

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
    """One sequence's result of a decode call: its frame, and its next token (``None`` when the
    engine asked for none, ``seq.sample_next`` False)."""

    seq: Sequence
    codes: list[int]
    token: Optional[int]


class ModelRunner(abc.ABC):
    max_num_seqs: int
    max_model_len: int                       # cache positions per sequence: prompt + frames
    eos_token_ids: frozenset[int] = frozenset()
    # Tokens counted by max_new_tokens that never become a frame: a family whose reference counts
    # a last token it never turns into a frame sets 1 (its N tokens give at most N - 1 frames).
    max_new_tokens_offset: int = 0

    def check(self, prompt: Any, params: SamplingParams) -> None:
        """Raise a ``ValueError`` (an ``InvalidRequest``) if the request cannot run at all, e.g. its
        prompt is not one this runner takes or ``params.extra`` is out of range. Called when the
        request is added."""

    @abc.abstractmethod
    def prompt_length(self, prompt: Any) -> int:
        """Cache positions the prompt takes (called after ``check``)."""

    @abc.abstractmethod
    def prefill(self, seq: Sequence) -> int:
        """Run the prompt of a newly admitted sequence into its slot; return its first token."""

    def prefill_many(self, seqs: list[Sequence]) -> list[int]:
        """Prefill the sequences admitted in one step (their first tokens, in order). A runner may
        run them together; if this raises, the engine prefills them one by one."""
        return [self.prefill(seq) for seq in seqs]

    @abc.abstractmethod
    def decode(self, seqs: list[Sequence]) -> list[StepOutput]:
        """Advance every sequence by one frame (one output per sequence, in order)."""

    def extend(self, seq: Sequence, items: list[Any], end: bool) -> None:
        """Input that arrived for a running request (``AREngine.append_input``), in order; ``end``:
        the input is complete. Called only for requests added with ``input_open``."""
        raise TypeError(f"{type(self).__name__} takes no input while a request runs")

    def ready(self, seq: Sequence) -> bool:
        """Whether ``seq``'s next decode step has its input (called after the step is planned:
        ``seq.sample_next`` is set). A request that is not ready waits; it is asked again next step."""
        return True

    def release(self, seq: Sequence) -> None:
        """Drop the model state of a finished or cancelled sequence."""
        seq.state = None
