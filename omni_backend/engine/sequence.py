"""Per-request state of the AR engine, keyed by request id."""
from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from typing import Any, Optional

import torch

from omni_backend.errors import InvalidRequest, PromptTooLongError

__all__ = ["SamplingParams", "SamplingParamsError", "PromptTooLongError", "SequenceStatus", "Sequence", "FrameEvent",
           "check_warp"]


class SamplingParamsError(InvalidRequest, ValueError):
    """A sampling parameter out of range; ``field`` names it."""


def check_warp(prefix: str, do_sample: bool, temperature: float, top_k: int, top_p: float) -> None:
    """Range checks of one set of warpers (``prefix`` names the fields in the error), for the
    engine's own and for a runner's extra ones."""
    if do_sample and not (temperature > 0):
        raise SamplingParamsError(prefix + "temperature", f"must be > 0 when sampling, got {temperature!r}")
    if not isinstance(top_k, int) or top_k < 0:
        raise SamplingParamsError(prefix + "top_k", f"must be an integer >= 0, got {top_k!r}")
    if not (0.0 < top_p <= 1.0):
        raise SamplingParamsError(prefix + "top_p", f"must be in (0, 1], got {top_p!r}")


@dataclass(frozen=True)
class SamplingParams:
    """Decoding parameters of one request: the ones every autoregressive model shares.

    ``do_sample`` / ``temperature`` / ``top_k`` / ``top_p`` / ``repetition_penalty`` choose the
    tokens the engine counts and checks for eos. ``max_new_tokens`` bounds those tokens; a runner
    may count some that never become a frame (``ModelRunner.max_new_tokens_offset``).
    ``min_new_tokens`` keeps eos out of the first tokens. ``seed`` seeds the request's own
    generator (``None``: a random seed), so sampling does not depend on other requests.

    ``extra`` holds the runner's own per-request parameters (e.g. sampling of a second model that
    completes each frame): its type is the runner's, the engine only passes it on and the runner
    validates it when the request is added (``ModelRunner.check``). ``None``: the runner's defaults.
    """

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    max_new_tokens: int = 2048
    min_new_tokens: int = 2
    seed: Optional[int] = None
    extra: Any = None

    @classmethod
    def greedy(cls, **overrides: Any) -> "SamplingParams":
        return cls(**{"do_sample": False, **overrides})

    def validate(self) -> "SamplingParams":
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise SamplingParamsError("max_new_tokens", f"must be an integer >= 1, got {self.max_new_tokens!r}")
        if not isinstance(self.min_new_tokens, int) or self.min_new_tokens < 0:
            raise SamplingParamsError("min_new_tokens", f"must be an integer >= 0, got {self.min_new_tokens!r}")
        if not (self.repetition_penalty > 0):
            raise SamplingParamsError("repetition_penalty", f"must be > 0, got {self.repetition_penalty!r}")
        check_warp("", self.do_sample, self.temperature, self.top_k, self.top_p)
        if self.seed is not None and (not isinstance(self.seed, int) or not 0 <= self.seed < 2 ** 63):
            raise SamplingParamsError("seed", f"must be an integer in [0, 2**63), got {self.seed!r}")
        return self


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One request inside the engine. ``prompt`` and ``state`` belong to the model runner.

    The engine counts ``num_tokens`` (tokens the runner returned) and ``num_frames`` (frames
    emitted). Before each runner call it sets the step's inputs: ``sample_next`` (whether this
    step's next token is wanted: False on the request's last step) and ``ban_eos`` (eos must not
    be chosen: ``min_new_tokens``).

    A request added with ``input_open`` takes more input while it runs (``AREngine.append_input``,
    e.g. text that an LLM is still writing): ``inbox`` holds what arrived and is not yet handed to
    the runner, ``inbox_end`` that the input is complete. ``waiting_since`` is when the request
    last found its runner without the input its next step needs (``None``: not waiting)."""

    def __init__(self, request_id: str, prompt: Any, params: SamplingParams, prompt_len: int = 0) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.prompt_len = prompt_len
        self.status = SequenceStatus.WAITING
        self.slot: Optional[int] = None
        self.num_tokens = 0
        self.num_frames = 0
        self.sample_next = True
        self.ban_eos = False
        self.finish_reason: Optional[str] = None
        self.state: Any = None
        self.input_open = False
        self.inbox: list[Any] = []
        self.inbox_end = False
        self.waiting_since: Optional[float] = None
        seed = params.seed if params.seed is not None else random.SystemRandom().randrange(2 ** 63)
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)

    def __repr__(self) -> str:
        return (f"Sequence({self.request_id!r}, {self.status.value}, slot={self.slot}, frames={self.num_frames}, "
                f"finish={self.finish_reason})")


@dataclass(frozen=True)
class FrameEvent:
    """What ``step()`` emits: one frame of one request, or the end of a request.

    ``codes`` holds the frame the runner made (its ids); it is ``None`` only on an end event
    without a frame (cancelled, or nothing to generate). ``finished`` is set on the last event of
    a request, with ``finish_reason`` ``stop`` (eos), ``length`` (max_new_tokens or the model
    length), ``cancelled``, ``error`` (``error`` then says what failed) or ``input_timeout`` (a
    request whose input stayed open waited longer than the engine's ``max_input_wait_s`` for it). ``index`` is the
    frame's position in the request (on an end event without a frame: the number of frames).
    """

    request_id: str
    codes: Optional[list[int]]
    finished: bool = False
    finish_reason: Optional[str] = None
    index: int = 0
    error: Optional[str] = None
