"""The throughput mode of Qwen3-Omni's thinker and talker (deploy option ``batch_mode: throughput``).

The exact runners (:mod:`.thinker_runner`, :mod:`.talker_runner`) run each sequence alone in the
reference's shapes, bit-exact whatever it is served with. These subclasses keep their prefill
(alone, into the request's own cache, then copied into its slot of a static per-slot cache) and
their token choice (per row, on the CPU, with the request's generator), and share the decode
step's forward passes between the rows (:func:`~.batched_decode.decode_rows`):

* thinker: one forward over all rows that draw a token;
* talker: the code predictor's 2-token prefill and its 14 steps once for all rows (every row is at
  the same predictor positions), then one talker forward over the rows that draw the next
  codebook 0.

A row's tokens then differ from solo only where floating-point order tips a near tie
(``tests/unit/test_qwen3_omni_throughput.py`` measures the logits' distance and the greedy tokens).

On CUDA (or when asked, ``static_step=True``, which the CPU tests use) a decode step runs the
static-buffer steps of :mod:`.graph_step` through
:class:`~omni_backend.engine.cuda_graphs.GraphBuckets`: captured per batch-size bucket
(``cuda_graph_sizes``) and attention-length bucket, replayed, or run eagerly with
``enforce_eager``. Row ``b`` is slot ``b``; the rows up to the highest slot in use step together.
"""
from __future__ import annotations

from typing import Optional

import torch

from omni_backend.engine import Sequence, StepOutput
from omni_backend.engine.cuda_graphs import GraphBuckets
from omni_backend.engine.kv_cache import length_buckets

from .batched_decode import decode_rows, slot_cache_for, store_prefill
from .generate import Sampling
from .graph_step import TalkerFrameStep, ThinkerDecodeStep, attention_length
from .layers import rms_norm, text_positions
from .talker_runner import TalkerRunner
from .thinker_runner import ThinkerRunner

__all__ = ["ThroughputThinkerRunner", "ThroughputTalkerRunner", "BATCH_MODES", "runner_class_for"]

BATCH_MODES = ("exact", "throughput")


def _positions(lengths: list[int], device: torch.device) -> torch.Tensor:
    """Text positions ``[3, B, 1]``: each row's next cache position (what the exact runners pass)."""
    return torch.cat([text_positions(n, 1, device) for n in lengths], dim=1)


class _StaticSteps:
    """A graph step's buckets: batch sizes x attention lengths (x ``flags``: extra boolean
    arguments of the step, e.g. sampling), captured on CUDA unless eager."""

    def __init__(self, step, max_rows: int, max_len: int, device: torch.device, graph_sizes: list[int] | None,
                 enforce_eager: bool, flags: tuple[tuple, ...] = ((),)) -> None:
        self.lengths = length_buckets(max_len)
        cuda = device.type == "cuda"
        self.buckets = GraphBuckets(step.run, graph_sizes or [1, 2, 4, 8, 16], max_rows,
                                    variants=[(length, *flag) for length in self.lengths for flag in flags],
                                    enabled=cuda and not enforce_eager, device=device if cuda else None)
        self.buckets.capture()

    def run(self, batch: int, furthest: int, *flags) -> int:
        return self.buckets.run(batch, attention_length(self.lengths, furthest), *flags)


def _use_static(device: torch.device, static_step: bool | None) -> bool:
    return device.type == "cuda" if static_step is None else static_step


class ThroughputThinkerRunner(ThinkerRunner):
    def __init__(self, *args, graph_sizes: list[int] | None = None, enforce_eager: bool = False,
                 static_step: bool | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.slots = slot_cache_for(self.thinker.model.layers, self.max_num_seqs, self.max_model_len)
        self.lengths = [0] * self.max_num_seqs   # cache positions written per slot
        self.step = self.static = None
        if _use_static(self.device, static_step):
            self.step = ThinkerDecodeStep(self.thinker, self.slots, self.max_num_seqs)
            self.static = _StaticSteps(self.step, self.max_num_seqs, self.max_model_len, self.device, graph_sizes,
                                       enforce_eager)

    def _decode_static(self, rows: list[Sequence]) -> dict[int, int]:
        """The static step over slots ``0..max slot``; each row's token chosen from its logits."""
        step, device = self.step, self.device
        batch = max(seq.slot for seq in rows) + 1
        ids = [0] * batch
        for seq in rows:
            ids[seq.slot] = int(seq.state.ids[0, -1])
        # padding rows write at their slot's next free position: never over a running row's keys
        positions = [min(n, self.max_model_len - 1) for n in self.lengths[:batch]]
        deltas = [0] * batch
        for seq in rows:
            deltas[seq.slot] = seq.state.delta
        step.ids[:batch].copy_(torch.tensor(ids), non_blocking=True)
        step.positions[:batch].copy_(torch.tensor(positions), non_blocking=True)
        step.deltas[:batch].copy_(torch.tensor(deltas), non_blocking=True)
        self.static.run(batch, max(self.lengths[seq.slot] for seq in rows))
        tokens = {}
        for seq in rows:
            self.lengths[seq.slot] += 1
            tokens[id(seq)] = self._choose(seq, step.logits[seq.slot:seq.slot + 1].unsqueeze(1))
        return tokens

    def prefill(self, seq: Sequence) -> int:
        token = super().prefill(seq)
        self.lengths[seq.slot] = store_prefill(self.slots, seq.slot, seq.state.cache)
        seq.state.cache = None   # the slot holds it now
        return token

    def decode(self, seqs: list[Sequence]) -> list[StepOutput]:
        last = [int(seq.state.ids[0, -1]) for seq in seqs]
        rows = [seq for seq in seqs if seq.sample_next]
        tokens: dict[int, int] = {}
        if rows and self.step is not None:
            tokens = self._decode_static(rows)
        elif rows:
            thinker, device = self.thinker, self.device
            lengths = [self.lengths[seq.slot] for seq in rows]
            ids = torch.cat([seq.state.ids[:, -1:] for seq in rows]).to(device)     # [B, 1]
            hidden = thinker.embed(ids)
            rotary = [n + seq.state.delta for n, seq in zip(lengths, rows)]   # images move positions
            cos, sin = thinker.rotary(_positions(rotary, device), hidden.dtype)
            slots = torch.tensor([seq.slot for seq in rows], device=device)
            positions = torch.tensor(lengths, device=device)
            hidden = decode_rows(thinker.model.layers, hidden, cos, sin, self.slots, slots, positions,
                                 max(lengths) + 1)
            norm = thinker.model.norm
            logits = thinker.lm_head(rms_norm(hidden, norm.weight, norm.variance_epsilon))
            for row, seq in enumerate(rows):
                self.lengths[seq.slot] += 1
                tokens[id(seq)] = self._choose(seq, logits[row:row + 1])
        return [StepOutput(seq, [token], tokens.get(id(seq))) for seq, token in zip(seqs, last)]


class ThroughputTalkerRunner(TalkerRunner):
    def __init__(self, *args, graph_sizes: list[int] | None = None, enforce_eager: bool = False,
                 static_step: bool | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.slots = slot_cache_for(self.talker.model.layers, self.max_num_seqs, self.max_model_len)
        self.lengths = [0] * self.max_num_seqs
        self.step = self.static = None
        if _use_static(self.device, static_step):
            self.step = TalkerFrameStep(self.talker, self.slots, self.max_num_seqs)
            self.static = _StaticSteps(self.step, self.max_num_seqs, self.max_model_len, self.device, graph_sizes,
                                       enforce_eager, flags=((False,), (True,)))

    @staticmethod
    def _greedy_predictor(seqs: list[Sequence]) -> bool:
        return all(not s.do_sample and s.repetition_penalty == 1.0 and not s.suppress
                   for s in (seq.state.predictor for seq in seqs))

    @staticmethod
    def _step_samplable(seqs: list[Sequence]) -> bool:
        """Whether the static step can choose every row's codes (no penalty or suppressed ids:
        the code predictor's samplers have none)."""
        return all(s.repetition_penalty == 1.0 and not s.suppress for s in (seq.state.predictor for seq in seqs))

    def _predictor_rows(self, seqs: list[Sequence], batch: int) -> bool:
        """Fill the static step's sampling buffers; returns whether any row samples."""
        step = self.step
        rows = {seq.slot: seq for seq in seqs}
        sample, temperature, top_k, top_p, seed, counter = [], [], [], [], [], []
        for slot in range(batch):
            seq = rows.get(slot)
            s = seq.state.predictor if seq is not None else Sampling()
            sample.append(bool(s.do_sample))
            temperature.append(float(s.temperature or 1.0))
            top_k.append(int(s.top_k or 0))
            top_p.append(float(s.top_p if s.top_p is not None else 1.0))
            seed.append(seq.seed if seq is not None else 0)   # the request's (given or drawn at its start)
            counter.append(len(seq.state.generated) if seq is not None else 0)
        for buffer, values in ((step.do_sample, sample), (step.temperature, temperature), (step.top_k, top_k),
                               (step.top_p, top_p), (step.seed, seed), (step.counter, counter)):
            buffer[:batch].copy_(torch.tensor(values, dtype=buffer.dtype), non_blocking=True)
        return any(sample)

    def _decode_static(self, seqs: list[Sequence]) -> list[StepOutput]:
        """The static frame step over slots ``0..max slot``."""
        step, device = self.step, self.device
        batch = max(seq.slot for seq in seqs) + 1
        slots = [seq.slot for seq in seqs]
        index = torch.tensor(slots, device=device)
        pending = [0] * batch
        for seq in seqs:
            pending[seq.slot] = int(seq.state.pending)
        positions = [min(n, self.max_model_len - 1) for n in self.lengths[:batch]]
        deltas = [0] * batch
        for seq in seqs:
            deltas[seq.slot] = seq.state.delta
        step.pending[:batch].copy_(torch.tensor(pending), non_blocking=True)
        step.positions[:batch].copy_(torch.tensor(positions), non_blocking=True)
        step.deltas[:batch].copy_(torch.tensor(deltas), non_blocking=True)
        step.hidden.index_copy_(0, index, torch.cat([seq.state.hidden for seq in seqs]).to(step.hidden.dtype))
        texts = [seq.state.text.trailing.row(len(seq.state.generated) - 1).reshape(1, 1, -1) if seq.sample_next
                 else torch.zeros_like(step.text[:1]) for seq in seqs]
        step.text.index_copy_(0, index, torch.cat(texts).to(device, step.text.dtype))
        sample = self._predictor_rows(seqs, batch)
        self.static.run(batch, max(self.lengths[slot] for slot in slots), sample)
        codes = step.codes[:batch].cpu().tolist()
        outputs = []
        for seq in seqs:
            token = None
            if seq.sample_next:
                self.lengths[seq.slot] += 1
                seq.state.hidden = step.next_hidden[seq.slot:seq.slot + 1].clone()
                token = int(self._choose_first(seq, step.logits[seq.slot:seq.slot + 1].unsqueeze(1)))
            outputs.append(StepOutput(seq, codes[seq.slot], token))
        return outputs

    def prefill(self, seq: Sequence) -> int:
        token = super().prefill(seq)
        self.lengths[seq.slot] = store_prefill(self.slots, seq.slot, seq.state.cache)
        seq.state.cache = None
        return token

    def _predictor_choice(self, seqs: list[Sequence]):
        """The code predictor's token choice for all rows: one argmax when every row is greedy
        (the reference's greedy predictor has no processors), else each row's own sampler."""
        samplers: list[Sampling] = [seq.state.predictor for seq in seqs]
        if self._greedy_predictor(seqs):
            return lambda _step, scores: torch.argmax(scores, dim=-1)

        def choose(_step: int, scores: torch.Tensor) -> torch.Tensor:
            cpu = scores.cpu()
            picked = [s.choose(cpu[row:row + 1], None, seq.generator) for row, (s, seq) in
                      enumerate(zip(samplers, seqs))]
            return torch.cat(picked).to(self.device)
        return choose

    def decode(self, seqs: list[Sequence]) -> list[StepOutput]:
        if self.step is not None and self._step_samplable(seqs):
            return self._decode_static(seqs)
        talker, device = self.talker, self.device
        states = [seq.state for seq in seqs]
        first = torch.cat([st.pending for st in states])                            # [B]
        hidden = torch.cat([st.hidden for st in states])                            # [B, 1, H]
        residual, frame_embeds = talker.complete_frame(first, hidden, self._predictor_choice(seqs))
        residual = residual.tolist()
        frames = [[int(first[row])] + residual[row] for row in range(len(seqs))]
        next_rows = [row for row, seq in enumerate(seqs) if seq.sample_next]
        tokens: dict[int, Optional[int]] = {}
        if next_rows:
            index = torch.tensor(next_rows, device=device)
            embeds = frame_embeds.index_select(0, index)
            text = torch.cat([states[row].text.trailing.row(len(states[row].generated) - 1).reshape(1, 1, -1)
                              for row in next_rows]).to(device, embeds.dtype)
            embeds = embeds + text
            lengths = [self.lengths[seqs[row].slot] for row in next_rows]
            rotary = [n + seqs[row].state.delta for n, row in zip(lengths, next_rows)]   # images move positions
            cos, sin = talker.rotary(_positions(rotary, device), embeds.dtype)
            slots = torch.tensor([seqs[row].slot for row in next_rows], device=device)
            out = decode_rows(talker.model.layers, embeds, cos, sin, self.slots, slots,
                              torch.tensor(lengths, device=device), max(lengths) + 1)
            norm = talker.model.norm
            out = rms_norm(out, norm.weight, norm.variance_epsilon)
            logits = talker.codec_head(out)
            for j, row in enumerate(next_rows):
                seq = seqs[row]
                self.lengths[seq.slot] += 1
                seq.state.hidden = out[j:j + 1]
                tokens[row] = int(self._choose_first(seq, logits[j:j + 1]))
        return [StepOutput(seq, frames[row], tokens.get(row)) for row, seq in enumerate(seqs)]


def runner_class_for(stage: str, batch_mode: str) -> type:
    """The runner class of ``stage`` (``thinker`` or ``talker``) in ``batch_mode``."""
    if batch_mode not in BATCH_MODES:
        raise ValueError(f"batch_mode: unknown value {batch_mode!r}; available: {', '.join(BATCH_MODES)}")
    exact = {"thinker": ThinkerRunner, "talker": TalkerRunner}[stage]
    return exact if batch_mode == "exact" else {"thinker": ThroughputThinkerRunner,
                                                "talker": ThroughputTalkerRunner}[stage]
