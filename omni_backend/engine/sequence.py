"""Per-request state of the AR engine, keyed by request id."""
from __future__ import annotations

import enum
import random
import time
from dataclasses import dataclass
from typing import Any, Optional

import torch

from omni_backend.errors import InvalidRequest

__all__ = ["SamplingParams", "SamplingParamsError", "SequenceStatus", "Sequence", "FrameEvent"]


class SamplingParamsError(InvalidRequest, ValueError):
    """A sampling parameter out of range; ``field`` names it."""


@dataclass(frozen=True)
class SamplingParams:
    """Decoding parameters of one request.

    ``do_sample`` / ``temperature`` / ``top_k`` / ``top_p`` / ``repetition_penalty`` drive codebook 0
    (the talker); the ``subtalker_*`` ones drive the other codebooks (the code predictor).
    ``max_new_tokens`` counts codebook-0 tokens the way the reference ``generate()`` does: the
    last one never becomes a frame, so a request yields at most ``max_new_tokens - 1`` frames.
    ``min_new_tokens`` keeps eos out of the first tokens. ``seed`` seeds the request's own
    generator (``None``: a random seed), so sampling does not depend on other requests.
    """

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    subtalker_do_sample: bool = True
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    max_new_tokens: int = 2048
    min_new_tokens: int = 2
    seed: Optional[int] = None

    @classmethod
    def greedy(cls, **overrides: Any) -> "SamplingParams":
        return cls(**{"do_sample": False, "subtalker_do_sample": False, **overrides})

    def validate(self) -> "SamplingParams":
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise SamplingParamsError("max_new_tokens", f"must be an integer >= 1, got {self.max_new_tokens!r}")
        if not isinstance(self.min_new_tokens, int) or self.min_new_tokens < 0:
            raise SamplingParamsError("min_new_tokens", f"must be an integer >= 0, got {self.min_new_tokens!r}")
        if not (self.repetition_penalty > 0):
            raise SamplingParamsError("repetition_penalty", f"must be > 0, got {self.repetition_penalty!r}")
        for prefix, sample, temperature, top_k, top_p in (
                ("", self.do_sample, self.temperature, self.top_k, self.top_p),
                ("subtalker_", self.subtalker_do_sample, self.subtalker_temperature, self.subtalker_top_k,
                 self.subtalker_top_p)):
            if sample and not (temperature > 0):
                raise SamplingParamsError(prefix + "temperature", f"must be > 0 when sampling, got {temperature!r}")
            if not isinstance(top_k, int) or top_k < 0:
                raise SamplingParamsError(prefix + "top_k", f"must be an integer >= 0, got {top_k!r}")
            if not (0.0 < top_p <= 1.0):
                raise SamplingParamsError(prefix + "top_p", f"must be in (0, 1], got {top_p!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or not 0 <= self.seed < 2 ** 63):
            raise SamplingParamsError("seed", f"must be an integer in [0, 2**63), got {self.seed!r}")
        return self


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One request inside the engine. ``prompt`` and ``state`` belong to the model runner."""

    def __init__(self, request_id: str, prompt: Any, params: SamplingParams) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.status = SequenceStatus.WAITING
        self.slot: Optional[int] = None
        self.num_frames = 0
        self.finish_reason: Optional[str] = None
        self.state: Any = None
        self.arrival_time = time.monotonic()
        seed = params.seed if params.seed is not None else random.SystemRandom().randrange(2 ** 63)
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, {self.status.value}, slot={self.slot}, frames={self.num_frames}, "
                f"finish={self.finish_reason})")


@dataclass(frozen=True)
class FrameEvent:
    """What ``step()`` emits: one frame of one request, or the end of a request.

    ``codes`` holds the frame's codebook ids (16 for Qwen3-TTS); it is ``None`` only on an end
    event without a frame (cancelled, or nothing to generate). ``finished`` is set on the last
    event of a request, with ``finish_reason`` ``stop`` (eos), ``length`` (max_new_tokens or the
    model length), ``cancelled`` or ``error`` (``error`` then says what failed). ``index`` is the
    frame's position in the request (on an end event without a frame: the number of frames).
    """

    request_id: str
    codes: Optional[list[int]]
    finished: bool = False
    finish_reason: Optional[str] = None
    index: int = 0
    error: Optional[str] = None
