"""Offline Qwen3-Omni generation, one request at a time, in the reference's order and shapes:
thinker -> talker (+ code predictor) -> code2wav. Used by the parity tests and as the plain
reference path of the stage runners.

* :func:`thinker_generate`: prefill the prompt, then one token per step until an eos id or
  ``max_new_tokens``; ``on_tokens`` sees every new token as it is chosen (the streamed hand-off to
  the talker);
* :func:`talker_generate`: the talker's prefill from a :class:`~.prompt.TalkerInput`, then per
  step: codebook 0 from ``codec_head`` (repetition penalty over the codebook-0 ids generated so
  far, the last 1024 codec ids except eos suppressed), the residual codebooks from the code
  predictor, and the next input = the sum of the frame's G codebook embeddings + the next
  trailing-text row. A frame is emitted per step; the eos step emits none;
* :func:`generate`: both, then ``code2wav.chunked_decode(codes, 300, 25)``.

Greedy decoding equals the reference's ``generate()`` bit for bit on CPU (float32); sampling
draws from a ``torch.Generator`` in the reference's order (thinker, then per talker step codebook
0 and the code predictor's G-1 draws, which uses top-k 50 / top-p 0.8 as the reference does),
so a seed gives the reference's draws when its global generator had that seed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import torch

from .checkpoint import Qwen3OmniCheckpoint
from .code2wav import REFERENCE_CHUNK_FRAMES, REFERENCE_LEFT_CONTEXT_FRAMES
from .layers import text_positions
from .prompt import COMMON_SHAPE_ROWS, TalkerInput, ThinkerPrompt
from .prompt_embeds import ThinkerInputs, prompt_embeds
from .talker import Talker
from .thinker import Thinker

__all__ = [
    "Sampling",
    "ThinkerResult",
    "TalkerResult",
    "OmniResult",
    "thinker_generate",
    "talker_generate",
    "generate",
    "TALKER_DEFAULTS",
    "CODE_PREDICTOR_SAMPLING",
]


@dataclass(frozen=True)
class Sampling:
    """How one token is chosen from float32 logits ``[1, vocab]``, in the reference's processor
    order: repetition penalty, suppressed ids, then (sampling only) temperature, top-k, top-p."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    suppress: tuple[int, ...] = ()

    def choose(self, logits: torch.Tensor, previous: torch.Tensor | None,
               generator: torch.Generator | None) -> torch.Tensor:
        """The chosen id ``[1]``; ``previous`` ``[1, n]`` are the ids the penalty applies to."""
        scores = logits
        if self.repetition_penalty != 1.0 and previous is not None and previous.numel():
            picked = torch.gather(scores, 1, previous)
            picked = torch.where(picked < 0, picked * self.repetition_penalty, picked / self.repetition_penalty)
            scores = scores.scatter(1, previous, picked)
        if self.suppress:
            mask = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device)
            mask[list(self.suppress)] = True
            scores = torch.where(mask, -float("inf"), scores)
        if not self.do_sample:
            return torch.argmax(scores, dim=-1)
        if self.temperature != 1.0:
            scores = scores / self.temperature
        if self.top_k:
            k = min(self.top_k, scores.shape[-1])
            scores = scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], -float("inf"))
        if self.top_p < 1.0:
            ordered, order = torch.sort(scores, descending=False)
            cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
            remove = cumulative <= (1 - self.top_p)
            remove[..., -1:] = 0
            scores = scores.masked_fill(remove.scatter(1, order, remove), -float("inf"))
        probs = torch.softmax(scores, dim=-1)
        return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)


# the reference generate()'s talker defaults (its do_sample default is True)
TALKER_DEFAULTS = {"do_sample": True, "top_k": 50, "top_p": 1.0, "temperature": 0.9, "repetition_penalty": 1.05,
                   "max_new_tokens": 4096}
# what the reference passes to the code predictor when the talker samples
CODE_PREDICTOR_SAMPLING = Sampling(do_sample=True, top_k=50, top_p=0.8)


@dataclass
class ThinkerResult:
    prompt_ids: list[int]
    generated: list[int]
    finish_reason: str                         # "stop" (an eos id) or "length"
    prompt_hidden: torch.Tensor | None = None  # [1, L, hidden]: hidden state accept_layer over the prompt

    @property
    def sequence(self) -> list[int]:
        return self.prompt_ids + self.generated


@torch.inference_mode()
def thinker_generate(thinker: Thinker, prompt_ids: Sequence[int], max_new_tokens: int = 1024,
                     eos_token_ids: Sequence[int] = (151645,), sampling: Sampling = Sampling(),
                     generator: torch.Generator | None = None, accept_layer: int | None = None,
                     on_tokens: Callable[[list[int], bool], None] | None = None,
                     media: ThinkerInputs | None = None) -> ThinkerResult:
    """Greedy (or sampled) thinker answer to ``prompt_ids``. ``on_tokens(ids, last)`` is called
    with each new token (``last``: it ends the answer). ``media``: the prompt's input when it holds
    media (:func:`~.prompt_embeds.prompt_embeds`)."""
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    device = thinker.lm_head.weight.device
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
    cache = thinker.new_cache()
    delta = media.delta if media is not None else 0
    if media is None:
        out = thinker(ids, cache, accept_layer=accept_layer)
    else:
        out = thinker(ids, cache, media.positions, accept_layer=accept_layer, inputs_embeds=media.embeds,
                      deepstack=media.deepstack, visual_mask=media.visual_mask)
    result = ThinkerResult(list(prompt_ids), [], "length", out.accept_hidden)
    sequence = ids
    eos = set(int(t) for t in eos_token_ids)
    while True:
        token = sampling.choose(out.logits[:, -1].to(torch.float32), sequence, generator)
        value = int(token)
        result.generated.append(value)
        sequence = torch.cat((sequence, token.view(1, 1)), dim=1)
        last = value in eos or len(result.generated) >= max_new_tokens
        if on_tokens is not None:
            on_tokens([value], last)
        if last:
            result.finish_reason = "stop" if value in eos else "length"
            return result
        position = text_positions(cache.length + delta, 1, device)
        out = thinker(token.view(1, 1), cache, position)


@dataclass
class TalkerResult:
    codes: torch.Tensor  # [G, frames] int64
    finish_reason: str   # "stop" (codec eos) or "length"


@torch.inference_mode()
def talker_generate(talker: Talker, text: TalkerInput, max_new_tokens: int = 4096, sampling: Sampling | None = None,
                    generator: torch.Generator | None = None) -> TalkerResult:
    """Codec frames of one request; the trailing text must have arrived for every frame it makes
    (here: the thinker has finished, or ``text.trailing`` has the rows)."""
    c = talker.config
    if sampling is None:
        sampling = Sampling(repetition_penalty=TALKER_DEFAULTS["repetition_penalty"])
    sampling = Sampling(sampling.do_sample, sampling.temperature, sampling.top_k, sampling.top_p,
                        sampling.repetition_penalty, c.suppressed_codec_ids)
    # the reference mirrors the talker's do_sample onto the code predictor
    predictor_sampling = CODE_PREDICTOR_SAMPLING if sampling.do_sample else Sampling()
    device = talker.codec_head.weight.device
    cache = talker.new_cache()
    prefill = text.prefill()
    positions, delta = text.positions(prefill.shape[1])
    logits, hidden = talker(prefill, cache, positions)
    generated: list[torch.Tensor] = []
    frames: list[torch.Tensor] = []
    while True:
        previous = torch.stack(generated, dim=1) if generated else None
        first = sampling.choose(logits[:, -1].to(torch.float32), previous, generator)
        generated.append(first)
        if int(first) == c.codec_eos_token_id or len(generated) >= max_new_tokens:
            reason = "stop" if int(first) == c.codec_eos_token_id else "length"
            break
        step = len(generated) - 1
        if not text.trailing.has_row(step):
            raise RuntimeError(f"trailing text row {step} has not arrived (feed the thinker's tokens first)")
        residual, frame_embed = talker.complete_frame(
            first, hidden[:, -1:], lambda _step, scores: predictor_sampling.choose(scores, None, generator))
        frames.append(torch.cat((first.view(1, 1), residual), dim=1))
        logits, hidden = talker.next_frame(frame_embed, text.trailing.row(step), cache, delta)
    codes = torch.cat(frames, dim=0).T.contiguous() if frames else torch.zeros(c.num_code_groups, 0,
                                                                               dtype=torch.long, device=device)
    return TalkerResult(codes.to(torch.long), reason)


@dataclass
class OmniResult:
    prompt_ids: list[int]
    sequence: list[int]                   # prompt + the thinker's answer
    thinker_finish_reason: str
    codes: torch.Tensor | None = None     # [G, frames] int64
    talker_finish_reason: str | None = None
    waveform: torch.Tensor | None = None  # [samples] float32, 24 kHz
    extra: dict = field(default_factory=dict)


def generate(checkpoint: Qwen3OmniCheckpoint, messages: Sequence[Mapping] | None = None, prompt: str | None = None,
             system: str | None = None, speaker: str = "Ethan", return_audio: bool = True,
             thinker_max_new_tokens: int = 1024, thinker_eos_token_ids: Sequence[int] | None = None,
             thinker_sampling: Sampling = Sampling(), talker_max_new_tokens: int = TALKER_DEFAULTS["max_new_tokens"],
             talker_sampling: Sampling | None = None, seed: int | None = None,
             prompt_ids: Sequence[int] | None = None) -> OmniResult:
    """The reference ``Qwen3OmniMoeForConditionalGeneration.generate`` for a chat (text and audio
    content parts).

    ``talker_sampling`` defaults to greedy with the reference's repetition penalty 1.05 (pass
    :data:`TALKER_DEFAULTS` values for the reference's sampling defaults). ``prompt_ids`` skips
    the chat template (ids as the reference received them; text only)."""
    config = checkpoint.config
    if prompt_ids is None:
        built = checkpoint.prompt_builder().build_prompt(messages, prompt, system)
    else:
        built = ThinkerPrompt(list(prompt_ids))
    prompt_ids = built.ids
    generator = None
    if seed is not None:
        generator = torch.Generator(device=checkpoint.thinker.lm_head.weight.device).manual_seed(int(seed))
    if return_audio and (checkpoint.talker is None or checkpoint.code2wav is None):
        raise ValueError("return_audio needs the talker and code2wav (load_checkpoint parts)")
    media = prompt_embeds(checkpoint.thinker, checkpoint.audio_tower, config, built, checkpoint.visual)
    # the talker reads the thinker's hidden state accept_hidden_layer at the media placeholders
    accept = config.talker.accept_hidden_layer if return_audio and built.multimodal else None
    eos = (config.im_end_token_id,) if thinker_eos_token_ids is None else tuple(thinker_eos_token_ids)
    thinker = thinker_generate(checkpoint.thinker, prompt_ids, thinker_max_new_tokens, eos, thinker_sampling,
                               generator, accept_layer=accept, media=media)
    result = OmniResult(prompt_ids, thinker.sequence, thinker.finish_reason)
    if not return_audio:
        return result
    # the whole answer projected at once: the reference's shape
    text_input = TalkerInput(config, checkpoint.thinker, checkpoint.talker, prompt_ids, speaker,
                             prompt_hidden=thinker.prompt_hidden,
                             start_rows=max(COMMON_SHAPE_ROWS, len(thinker.generated) + len(prompt_ids)),
                             image_grids=[image.grid for image in built.images])
    text_input.add(thinker.generated, last=True)
    talker = talker_generate(checkpoint.talker, text_input, talker_max_new_tokens, talker_sampling, generator)
    result.codes, result.talker_finish_reason = talker.codes, talker.finish_reason
    with torch.inference_mode():
        result.waveform = checkpoint.code2wav.chunked_decode(
            talker.codes.unsqueeze(0), REFERENCE_CHUNK_FRAMES, REFERENCE_LEFT_CONTEXT_FRAMES)[0].float()
    return result
