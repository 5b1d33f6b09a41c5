"""Token selection for one row of logits, as transformers' ``generate()`` does it.

The processors run in transformers' order (repetition penalty, min-new-tokens, suppressed ids,
then for sampling temperature, top-k, top-p) and use its exact tensor operations, on a
``[1, vocab]`` row: greedy picks are therefore bit-identical to the reference's, and a row's
result never depends on the other rows of a batch. Sampling draws from the request's own
``torch.Generator``.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence as Seq

import torch

__all__ = ["TokenRules", "apply_repetition_penalty", "warp", "select", "select_rows"]


class TokenRules:
    """Fixed per-model rules for one vocabulary: ids that can never be emitted and the eos ids
    that the engine holds back while ``min_new_tokens`` is not reached (``ban_eos``)."""

    def __init__(self, vocab_size: int, eos_ids: Seq[int] = (), suppressed: Seq[int] = (),
                 device: torch.device | str = "cpu") -> None:
        vocab = torch.arange(vocab_size, device=device)
        self.eos_ids = tuple(eos_ids)
        self.eos_mask = self._mask(vocab, self.eos_ids)
        self.suppress_mask = self._mask(vocab, suppressed)

    @staticmethod
    def _mask(vocab: torch.Tensor, ids: Seq[int]) -> Optional[torch.Tensor]:
        if not ids:
            return None
        return torch.isin(vocab, torch.tensor(list(ids), dtype=torch.long, device=vocab.device)).view(1, -1)

    def apply(self, scores: torch.Tensor, generated: Seq[int], repetition_penalty: float,
              ban_eos: bool) -> torch.Tensor:
        if repetition_penalty != 1.0:
            scores = apply_repetition_penalty(scores, generated, repetition_penalty)
        if self.eos_mask is not None and ban_eos:
            scores = torch.where(self.eos_mask, -math.inf, scores)
        if self.suppress_mask is not None:
            scores = torch.where(self.suppress_mask, -float("inf"), scores)
        return scores


def apply_repetition_penalty(scores: torch.Tensor, generated: Seq[int], penalty: float) -> torch.Tensor:
    """Divide positive (multiply negative) scores of already generated ids by ``penalty``."""
    ids = torch.tensor([list(generated)], dtype=torch.long, device=scores.device)
    score = torch.gather(scores, 1, ids)
    score = torch.where(score < 0, score * penalty, score / penalty)
    return scores.scatter(1, ids, score)


def warp(scores: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    if temperature is not None and temperature != 1.0:
        scores = scores / temperature
    if top_k is not None and top_k != 0:
        k = min(top_k, scores.size(-1))
        scores = scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], -float("inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, sorted_indices = torch.sort(scores, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - top_p)
        remove[..., -1:] = 0
        scores = scores.masked_fill(remove.scatter(1, sorted_indices, remove), -float("inf"))
    return scores


def select(scores: torch.Tensor, do_sample: bool, temperature: float, top_k: int, top_p: float,
           generator: Optional[torch.Generator]) -> int:
    """One id from a ``[1, vocab]`` row of (processed) float32 scores."""
    if not do_sample:
        return int(torch.argmax(scores, dim=-1))
    probs = torch.softmax(warp(scores, temperature, top_k, top_p), dim=-1)
    return int(_draw(probs, generator))


def _draw(probs: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
    """One multinomial draw from a ``[1, vocab]`` row, on the generator's device (a request's
    generator lives on the CPU, so its draws do not depend on where the model runs)."""
    if generator is not None and probs.device != generator.device:
        probs = probs.to(generator.device)
    return torch.multinomial(probs, num_samples=1, generator=generator)[0, 0]


def select_rows(scores: torch.Tensor, do_sample: Seq[bool], temperature: Seq[float], top_k: Seq[int],
                top_p: Seq[float], generators: Seq[Optional[torch.Generator]]) -> torch.Tensor:
    """One id per row of ``[B, vocab]`` scores (no processors): greedy rows in one argmax, sampled
    rows one by one with their own generators. Returns ``[B]`` long."""
    out = torch.argmax(scores, dim=-1)
    for b, sample in enumerate(do_sample):
        if sample:
            probs = torch.softmax(warp(scores[b:b + 1], temperature[b], top_k[b], top_p[b]), dim=-1)
            out[b] = _draw(probs, generators[b])
    return out
