"""Qwen3-Omni's talker (+ code predictor) on the AR engine, fed the thinker's answer as it is written.

A request's prompt is a :class:`ThinkerAnswer`: the :class:`~.prompt.TalkerInput` built from the
thinker's prompt ids, taking the thinker's tokens as they arrive. The request enters the engine
once the talker's prefill can be built (``TalkerInput.ready``); later tokens come as the engine's
input (``extend``), the end of the answer with the last. A request whose next frame needs a text
row that has not arrived is not ``ready``: it waits, holding its slot, while other rows step.

Each sequence runs in the reference's shapes, one at a time, as :func:`~.generate.talker_generate`
does (the talker is an MoE: a batched forward would change every expert's matmul shapes): the
frame's codebook 0 from the codec head (repetition penalty over the codebook-0 ids so far, the
non-audio codec ids suppressed), codebooks 1..G-1 from the code predictor (sampled with the
reference's top-k 50 / top-p 0.8 when the talker samples, else greedy), then the next input = the
frame's summed codebook embeddings + the next text row. ``max_new_tokens`` counts codebook-0
tokens as the reference does: N tokens give at most N - 1 frames.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence as Seq

import torch

from omni_backend.engine import ModelRunner, SamplingParams, Sequence, StepOutput

from .generate import CODE_PREDICTOR_SAMPLING, TALKER_DEFAULTS, Sampling
from .layers import KVCache
from .prompt import TalkerInput
from .talker import Talker

__all__ = ["ThinkerAnswer", "TalkerRunner", "talker_sampling_defaults"]


class ThinkerAnswer:
    """The thinker's tokens for one talker request, in order. The thinker's last token (eos, or
    the one at its length limit) is never read by the talker; which token is last is known only
    when the answer ends, so the newest token is held back until more arrive or ``end``."""

    def __init__(self, talker_input: TalkerInput) -> None:
        self.input = talker_input
        self._held: Optional[int] = None

    def push(self, ids: Seq[int]) -> None:
        ids = [int(i) for i in ids]
        if not ids:
            return
        if self._held is not None:
            ids.insert(0, self._held)
        self._held = ids.pop()
        if ids:
            self.input.add(ids)

    def end(self) -> None:
        if self._held is None:
            raise ValueError("the thinker's answer ended without a token")
        self.input.add([self._held], last=True)
        self._held = None

    @property
    def ready(self) -> bool:
        """Whether the talker's prefill can be built."""
        return self.input.ready


@dataclass
class _State:
    text: TalkerInput
    cache: KVCache
    hidden: torch.Tensor                 # [1, 1, hidden]: the talker state that predicted `pending`
    pending: torch.Tensor                # [1] codebook 0 of the next frame
    generated: list[torch.Tensor]        # codebook-0 ids so far ([1] each)
    sampling: Sampling
    predictor: Sampling
    delta: int = 0                       # decode positions: cache length + delta (images move them)


class TalkerRunner(ModelRunner):
    max_new_tokens_offset = 1   # the reference counts the codebook-0 token drawn after the last frame

    def __init__(self, talker: Talker, max_num_seqs: int, max_model_len: int) -> None:
        self.talker = talker
        self.config = talker.config
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset({self.config.codec_eos_token_id})
        self.device = talker.codec_head.weight.device

    def check(self, prompt: Any, params: SamplingParams) -> None:
        if not isinstance(prompt, ThinkerAnswer):
            raise TypeError(f"expected a ThinkerAnswer, got {type(prompt).__name__}")
        if not prompt.ready:
            raise ValueError("the talker's prefill needs more of the thinker's answer")

    def prompt_length(self, prompt: ThinkerAnswer) -> int:
        return prompt.input.user.shape[1] + 9

    def _choose_first(self, seq: Sequence, logits: torch.Tensor) -> torch.Tensor:
        st: _State = seq.state
        sampling = st.sampling
        if seq.ban_eos:   # min_new_tokens
            sampling = Sampling(sampling.do_sample, sampling.temperature, sampling.top_k, sampling.top_p,
                                sampling.repetition_penalty,
                                sampling.suppress + (self.config.codec_eos_token_id,))
        previous = torch.stack(st.generated, dim=1) if st.generated else None
        # chosen on the CPU, where the request's generator lives (bit-identical on a CPU model)
        token = sampling.choose(logits[:, -1].to(torch.float32).cpu(), previous, seq.generator)
        st.generated.append(token)
        st.pending = token
        return token

    def prefill(self, seq: Sequence) -> int:
        p = seq.params
        answer: ThinkerAnswer = seq.prompt
        sampling = Sampling(p.do_sample, p.temperature, p.top_k, p.top_p, p.repetition_penalty,
                            self.config.suppressed_codec_ids)
        cache = self.talker.new_cache()
        prefill = answer.input.prefill()
        positions, delta = answer.input.positions(prefill.shape[1])
        logits, hidden = self.talker(prefill, cache, positions)
        seq.state = _State(answer.input, cache, hidden[:, -1:], torch.zeros(1, dtype=torch.long), [], sampling,
                           CODE_PREDICTOR_SAMPLING if p.do_sample else Sampling(), delta)
        return int(self._choose_first(seq, logits))

    def extend(self, seq: Sequence, items: list, end: bool) -> None:
        """The thinker's tokens that arrived (each item a list of ids); ``end``: its answer ended."""
        answer: ThinkerAnswer = seq.prompt
        for ids in items:
            answer.push(ids)
        if end:
            answer.end()

    def ready(self, seq: Sequence) -> bool:
        """A step that draws the next token feeds this frame's text row: it must have arrived."""
        st: _State = seq.state
        return not seq.sample_next or st.text.trailing.has_row(len(st.generated) - 1)

    def decode(self, seqs: list[Sequence]) -> list[StepOutput]:
        talker = self.talker
        outputs = []
        for seq in seqs:
            st: _State = seq.state
            step = len(st.generated) - 1
            first = st.pending
            residual, frame_embed = talker.complete_frame(
                first, st.hidden,
                lambda _step, scores: st.predictor.choose(scores.cpu(), None, seq.generator).to(self.device))
            frame = [int(first)] + residual[0].tolist()
            token: Optional[int] = None
            if seq.sample_next:
                logits, hidden = talker.next_frame(frame_embed, st.text.trailing.row(step), st.cache, st.delta)
                st.hidden = hidden[:, -1:]
                token = int(self._choose_first(seq, logits))
            outputs.append(StepOutput(seq, frame, token))
        return outputs


def talker_sampling_defaults(max_new_tokens: int = TALKER_DEFAULTS["max_new_tokens"]) -> SamplingParams:
    """The reference ``generate()``'s talker sampling (top-k 50, temperature 0.9, penalty 1.05)."""
    return SamplingParams(do_sample=TALKER_DEFAULTS["do_sample"], temperature=TALKER_DEFAULTS["temperature"],
                          top_k=TALKER_DEFAULTS["top_k"], top_p=TALKER_DEFAULTS["top_p"],
                          repetition_penalty=TALKER_DEFAULTS["repetition_penalty"], max_new_tokens=max_new_tokens,
                          min_new_tokens=0)
