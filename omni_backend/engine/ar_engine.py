"""The synchronous AR engine: continuous batching over a model runner.

``step()`` does, in order: drop cancelled requests (their slots are free for this step), admit
waiting requests into free slots and prefill them (at most ``max_prefills_per_step``), then
advance every running request by one frame in one batched ``decode`` call. It returns the frames
made in this step as :class:`FrameEvent`\\ s, so frames leave the engine as they are made. A
runner exception ends the requests it hit with a ``finish_reason="error"`` event (``error`` holds
the message); the engine keeps serving the others.

The engine decides when a request ends (the stop rules, :meth:`AREngine._plan` and
:meth:`AREngine._advance`): eos ids, ``max_new_tokens``, ``max_model_len`` and
``min_new_tokens`` are applied here, from the runner's data (``eos_token_ids``,
``max_new_tokens_offset``, ``max_model_len``); the runner only computes steps.

A request added with ``input_open=True`` takes more input while it runs (``append_input``: text
an LLM is still writing). What arrives is handed to the runner (``ModelRunner.extend``) at the
start of a step; a request whose runner lacks the input for its next step (``ModelRunner.ready``)
skips the step, keeping its slot and cache, while the other requests step on. One that waits
longer than ``max_input_wait_s`` ends with ``finish_reason="input_timeout"``. ``idle`` says the
last step computed nothing (every running request waiting): the caller may sleep until input.

``add_request``, ``append_input`` and ``cancel`` may be called from any thread; ``step`` from one thread at a time
(:class:`~omni_backend.engine.async_engine.AsyncEngine` runs it on its own thread).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Iterable, Optional

import torch

from .model_runner import ModelRunner
from .scheduler import Scheduler
from .sequence import FrameEvent, PromptTooLongError, SamplingParams, Sequence

__all__ = ["AREngine", "DuplicateRequestError"]

logger = logging.getLogger(__name__)


class DuplicateRequestError(ValueError):
    pass


class AREngine:
    def __init__(self, runner: ModelRunner, max_num_seqs: Optional[int] = None, max_prefills_per_step: int = 1,
                 num_threads: Optional[int] = None, default_params: Optional[SamplingParams] = None,
                 max_input_wait_s: Optional[float] = None) -> None:
        """``num_threads`` sets torch's intra-op threads for this process (None: leave as is).
        ``max_input_wait_s`` bounds how long a request with open input may wait for it (None: no bound)."""
        if num_threads is not None:
            torch.set_num_threads(int(num_threads))
        self.runner = runner
        max_num_seqs = runner.max_num_seqs if max_num_seqs is None else max_num_seqs
        if max_num_seqs > runner.max_num_seqs:
            raise ValueError(f"max_num_seqs {max_num_seqs} exceeds the runner's {runner.max_num_seqs} slots")
        self.scheduler = Scheduler(max_num_seqs, max_prefills_per_step)
        self.default_params = default_params or SamplingParams()
        self._lock = threading.Lock()
        self._incoming: list[Sequence] = []
        self._cancels: list[str] = []
        self._appends: list[tuple[str, Any, bool]] = []
        self._known: set[str] = set()   # request ids added and not yet ended
        self.max_input_wait_s = max_input_wait_s
        self.idle = False

    # -- thread-safe entry points
    def add_request(self, request_id: str, prompt: Any, params: Optional[SamplingParams] = None,
                    input_open: bool = False) -> Sequence:
        """Queue a request. Raises ``ValueError`` (an ``InvalidRequest``) for bad parameters or a
        prompt that can never fit, and :class:`DuplicateRequestError` for a request id in use.
        ``input_open``: more input follows through ``append_input``, the last with ``end``."""
        params = (params or self.default_params).validate()
        self.runner.check(prompt, params)
        prompt_len = self.runner.prompt_length(prompt)
        if prompt_len >= self.runner.max_model_len:   # not even one frame would fit
            raise PromptTooLongError("input", f"the prompt takes {prompt_len} positions; this engine holds "
                                              f"{self.runner.max_model_len} per request (max_model_len)")
        seq = Sequence(request_id, prompt, params, prompt_len)
        seq.input_open = input_open
        with self._lock:
            if request_id in self._known:
                raise DuplicateRequestError(f"request id {request_id!r} is already in the engine")
            self._known.add(request_id)
            self._incoming.append(seq)
        return seq

    def cancel(self, request_id: str) -> bool:
        """Stop a request; its slot is freed at the next step, which emits its ``cancelled`` end
        event. Returns False if the request is unknown or already ended."""
        with self._lock:
            if request_id not in self._known:
                return False
            self._cancels.append(request_id)
            return True

    def append_input(self, request_id: str, data: Any, end: bool = False) -> bool:
        """More input for a request added with ``input_open`` (``data`` may be None with ``end``),
        handed to the runner in order at the next step. Returns False if the request is unknown
        or already ended."""
        with self._lock:
            if request_id not in self._known:
                return False
            self._appends.append((request_id, data, end))
            return True

    def has_unfinished(self) -> bool:
        with self._lock:
            return bool(self._known)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    # -- the step
    def step(self) -> list[FrameEvent]:
        with self._lock:
            incoming, self._incoming = self._incoming, []
            cancels, self._cancels = self._cancels, []
            appends, self._appends = self._appends, []
        for seq in incoming:
            self.scheduler.add(seq)
        for request_id, data, end in appends:
            seq = self.scheduler.find(request_id)
            if seq is not None and seq.input_open and not seq.inbox_end:
                if data is not None:
                    seq.inbox.append(data)
                seq.inbox_end = seq.inbox_end or end
        events: list[FrameEvent] = []
        for request_id in dict.fromkeys(cancels):
            seq = self.scheduler.find(request_id)
            if seq is not None:
                self._end(seq, "cancelled", events, codes=None)

        with torch.inference_mode():
            admitted = self.scheduler.admit()
            for seq in admitted:
                self._plan(seq)
            tokens: list[int] = []
            if len(admitted) > 1:
                try:
                    tokens = self.runner.prefill_many(admitted)
                except Exception:  # find the culprit: one by one below
                    logger.exception("prefill of %d requests together failed; prefilling one by one", len(admitted))
                    tokens = []
            for index, seq in enumerate(admitted):
                if tokens:
                    token = tokens[index]
                else:
                    try:
                        token = self.runner.prefill(seq)
                    except Exception as exc:  # the request ends with an error event; others go on
                        logger.exception("prefill of %s failed", seq.request_id)
                        self._end(seq, "error", events, codes=None, error=f"{type(exc).__name__}: {exc}")
                        continue
                self._advance(seq, None, token, events)
            batch = self._ready(self.scheduler.decoding(), events)
            self.idle = not admitted and not batch
            if batch:
                try:
                    outputs = self.runner.decode(batch)
                except Exception as exc:
                    logger.exception("decode step failed for %d requests", len(batch))
                    for seq in batch:
                        self._end(seq, "error", events, codes=None, error=f"{type(exc).__name__}: {exc}")
                    outputs = []
                for out in outputs:
                    self._advance(out.seq, out.codes, out.token, events)
        return events

    def _ready(self, running: list[Sequence], events: list[FrameEvent]) -> list[Sequence]:
        """The requests that step now: input that arrived goes to the runner first; a request
        without the input for its next step waits (its slot and cache kept), and one that waited
        longer than ``max_input_wait_s`` ends."""
        batch = []
        now = time.monotonic()
        for seq in running:
            if seq.inbox or (seq.inbox_end and seq.input_open):
                items, seq.inbox = seq.inbox, []
                try:
                    self.runner.extend(seq, items, seq.inbox_end)
                except Exception as exc:  # the request ends with an error event; others go on
                    logger.exception("input for %s failed", seq.request_id)
                    self._end(seq, "error", events, codes=None, error=f"{type(exc).__name__}: {exc}")
                    continue
                seq.input_open = not seq.inbox_end
            self._plan(seq)
            if not seq.input_open or self.runner.ready(seq):
                seq.waiting_since = None
                batch.append(seq)
                continue
            if seq.waiting_since is None:
                seq.waiting_since = now
            elif self.max_input_wait_s is not None and now - seq.waiting_since > self.max_input_wait_s:
                self._end(seq, "input_timeout", events, codes=None,
                          error=f"no input arrived for {now - seq.waiting_since:.1f} s while the request waited "
                                f"for it (max_input_wait_s {self.max_input_wait_s:g})")
        return batch

    # -- the stop rules
    def _max_frames(self, seq: Sequence) -> int:
        return seq.params.max_new_tokens - self.runner.max_new_tokens_offset

    def _plan(self, seq: Sequence) -> None:
        """The step's inputs for ``seq``. A prefill always samples (its token may be eos). A decode
        step makes frame ``num_frames`` and samples the next token only if that token could become
        a frame: the frame is not the last one ``max_new_tokens`` allows, and the cache has a
        position for the frame's input (``prompt_len + frame < max_model_len``)."""
        if seq.num_tokens == 0:
            seq.sample_next = True
        else:
            frame = seq.num_frames
            seq.sample_next = (frame + 1 < self._max_frames(seq)
                               and seq.prompt_len + frame < self.runner.max_model_len)
        seq.ban_eos = seq.num_tokens < seq.params.min_new_tokens

    def _advance(self, seq: Sequence, codes: Optional[list[int]], token: Optional[int],
                 events: list[FrameEvent]) -> None:
        """Emit a step's frame (``None`` after a prefill) and end the request where a rule says so:
        no next token was asked for (``length``), or the token is eos (``stop``; eos is not a frame)."""
        if not seq.sample_next:
            self._end(seq, "length", events, codes=codes)
            return
        seq.num_tokens += 1
        if token in self.runner.eos_token_ids:
            self._end(seq, "stop", events, codes=codes)
        elif codes is None:   # the prefill's token: the request ends at once only if no frame is allowed
            if self._max_frames(seq) <= 0:
                self._end(seq, "length", events, codes=None)
        else:
            events.append(FrameEvent(seq.request_id, codes, False, None, seq.num_frames))
            seq.num_frames += 1

    def _end(self, seq: Sequence, reason: str, events: list[FrameEvent], codes: Optional[list[int]],
             error: Optional[str] = None) -> None:
        events.append(FrameEvent(seq.request_id, codes, True, reason, seq.num_frames, error))
        if codes is not None:
            seq.num_frames += 1
        self.runner.release(seq)
        self.scheduler.finish(seq, reason)
        with self._lock:
            self._known.discard(seq.request_id)

    # -- convenience
    def run_until_done(self, max_steps: Optional[int] = None) -> list[FrameEvent]:
        events: list[FrameEvent] = []
        steps = 0
        while self.has_unfinished():
            events.extend(self.step())
            steps += 1
            if max_steps is not None and steps >= max_steps:
                break
        return events

    def generate(self, requests: Iterable[tuple[str, Any, Optional[SamplingParams]]]) -> dict[str, list[list[int]]]:
        """Run requests to completion; frames per request id (for tests and scripts)."""
        for request_id, prompt, params in requests:
            self.add_request(request_id, prompt, params)
        frames: dict[str, list[list[int]]] = {}
        for event in self.run_until_done():
            bucket = frames.setdefault(event.request_id, [])
            if event.codes is not None:
                bucket.append(event.codes)
        return frames
