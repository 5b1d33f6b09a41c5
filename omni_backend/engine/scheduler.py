"""Admission and slots: which requests prefill this step, which decode.

Up to ``max_num_seqs`` requests run at once, each in its own slot (its row of the static KV
cache). Waiting requests are admitted in arrival order while slots are free, at most
``max_prefills_per_step`` per step, so a burst of arrivals delays the running requests by at most
that many prefills per step. A slot is free again as soon as its request finishes or is
cancelled.
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import Optional

from .sequence import Sequence, SequenceStatus

__all__ = ["Scheduler"]


class Scheduler:
    def __init__(self, max_num_seqs: int, max_prefills_per_step: int = 1) -> None:
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        if max_prefills_per_step < 1:
            raise ValueError(f"max_prefills_per_step must be >= 1, got {max_prefills_per_step}")
        self.max_num_seqs = max_num_seqs
        self.max_prefills_per_step = max_prefills_per_step
        self.waiting: deque[Sequence] = deque()
        self.running: dict[str, Sequence] = {}
        self._free_slots = list(range(max_num_seqs))
        heapq.heapify(self._free_slots)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self.running or any(s.request_id == request_id for s in self.waiting)

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def admit(self) -> list[Sequence]:
        """Give slots to waiting requests (arrival order); they are running from now on."""
        admitted = []
        while self.waiting and self._free_slots and len(admitted) < self.max_prefills_per_step:
            seq = self.waiting.popleft()
            seq.slot = heapq.heappop(self._free_slots)
            seq.status = SequenceStatus.RUNNING
            self.running[seq.request_id] = seq
            admitted.append(seq)
        return admitted

    def decoding(self) -> list[Sequence]:
        """Running requests in slot order."""
        return sorted(self.running.values(), key=lambda s: s.slot)

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a waiting or running request and free its slot."""
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        if self.running.pop(seq.request_id, None) is not None and seq.slot is not None:
            heapq.heappush(self._free_slots, seq.slot)
            seq.slot = None
        else:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass

    def find(self, request_id: str) -> Optional[Sequence]:
        seq = self.running.get(request_id)
        if seq is not None:
            return seq
        return next((s for s in self.waiting if s.request_id == request_id), None)
