"""Qwen3-TTS step logic for the AR engine.

Per request: the prompt is embedded and prefilled alone into the request's talker slot, which
gives codebook 0 of frame 0. Each engine step then advances all running requests together:

1. the code predictor completes every pending frame (codebooks 1..15: a 2-token prefill and 14
   single-token steps, the whole batch at once);
2. the frame is out; requests that go on feed the sum of the frame's 16 codebook embeddings plus
   their next trailing-text embedding to one batched talker decode, which gives codebook 0 of
   their next frame (or eos).

The engine decides when a request stops; the runner gives it the data: the eos id
(``eos_token_ids``), the cache size (``max_model_len``) and ``max_new_tokens_offset = 1``, as in
the reference ``generate()``, where ``max_new_tokens`` counts codebook-0 tokens and the last one
never becomes a frame (a request yields at most ``max_new_tokens - 1`` frames). The engine's
per-step inputs say whether a step's next codebook-0 token is wanted (``seq.sample_next``; on a
request's last step the exact step leaves its row out of the talker decode) and whether eos is
banned (``seq.ban_eos``).

The caches are static (allocated once for ``max_num_seqs`` slots). The arithmetic is
:class:`~.decode.Qwen3Decode`, written once; the runner picks one of two numerics strategies for
the decode step:

* :class:`~.exact_step.BatchInvariantExactStep` (the CPU default): every row in the reference's
  shapes, greedy codes bit for bit the reference's and independent of the batch
  (:class:`~.exact_step.BatchInvariantOps`); the greedy code-predictor loop replayed from a
  ``torch.jit.trace`` recording at batch 1;
* :class:`~.static_step.GraphSafeStaticStep` (the CUDA default): the whole frame (code predictor
  with in-step token selection, talker decode, codebook-0 processors) over static buffers in
  which row ``b`` is slot ``b``, captured as CUDA graphs per batch-size bucket
  (``cuda_graph_sizes``) and attention-length bucket at engine creation (``enforce_eager`` runs
  it without graphs). Its codes equal its own eager run
  (``omni_backend.testing.qwen3_tts_graph_check.greedy_graph_parity``), not the CPU reference
  bits.

Text that arrives in pieces (a ``text_open`` prompt, added with ``input_open``): the engine hands
the runner each piece's final text ids (``extend``; an empty list with the end of the input), which
grow the request's :class:`~.trailing_text.TrailingText`; a request whose next frame needs a text
row that has not arrived is not ``ready`` and waits. On the static path its row still runs inside
the batch as padding: its cache write goes to the position its own next step overwrites, and its
live state (pending token, hidden state) is read back first and restored when it steps again.

Prompts are prefilled in the reference's shapes on both paths (one at a time), or as one padded
forward where exactness is not asked for (the static path, ``batch_invariant=False``).
"""
from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from typing import Optional, Sequence as Seq

import torch

from omni_backend.engine import AREngine, ModelRunner, SamplingParams, Sequence, StepOutput
from omni_backend.engine.kv_cache import SHORTEST_LENGTH_BUCKET, length_buckets
from omni_backend.engine.sampling import TokenRules, select, select_rows
from omni_backend.models.qwen3_common.trailing_text import TrailingText

from .checkpoint import Qwen3TTSCheckpoint, load_checkpoint
from .config import GenerationDefaults
from .decode import Qwen3Decode
from .exact_step import BatchInvariantExactStep, BatchInvariantOps
from .prompt import Qwen3Prompt, embed_prompt, embed_text_ids
from .sampling_params import Qwen3SamplingParams, code_predictor_params
from .static_step import GraphSafeStaticStep

__all__ = ["Qwen3TTSRunner", "create_engine", "sampling_params_from_defaults"]

logger = logging.getLogger(__name__)


def sampling_params_from_defaults(defaults: GenerationDefaults, **overrides) -> SamplingParams:
    """The checkpoint's ``generation_config.json`` as engine parameters (overrides win)."""
    values = dict(do_sample=defaults.do_sample, temperature=defaults.temperature, top_k=defaults.top_k,
                  top_p=defaults.top_p, repetition_penalty=defaults.repetition_penalty,
                  max_new_tokens=defaults.max_new_tokens,
                  extra=Qwen3SamplingParams(subtalker_do_sample=defaults.subtalker_dosample,
                                            subtalker_temperature=defaults.subtalker_temperature,
                                            subtalker_top_k=defaults.subtalker_top_k,
                                            subtalker_top_p=defaults.subtalker_top_p))
    values.update(overrides)
    return SamplingParams(**values)


@dataclass
class _RequestState:
    prefill_length: int
    text: TrailingText                   # text rows, one per frame
    past_hidden: torch.Tensor            # [1, 1, hidden]: talker hidden that predicted `pending`
    pending: int                         # codebook 0 of the next frame
    generated: list[int]                 # codebook-0 ids so far (repetition penalty)
    code_predictor: Qwen3SamplingParams  # codebooks 1..15 sampling, resolved

    @property
    def frame(self) -> int:
        """Index of the next frame (= codebook-0 tokens so far - 1)."""
        return len(self.generated) - 1


class Qwen3TTSRunner(ModelRunner):
    """Runs a loaded checkpoint for the engine. ``max_model_len`` bounds prompt + frames per
    request (the talker cache holds ``max_num_seqs x max_model_len`` positions per layer).
    ``batch_invariant=False`` trades the bit-exactness of batched rows for speed.
    ``SamplingParams.extra`` is a :class:`Qwen3SamplingParams` (the code predictor's sampling).

    ``static_step`` (default: on CUDA) runs each decode step as :class:`GraphSafeStaticStep` over
    static buffers, captured as CUDA graphs per batch-size bucket (``cuda_graph_sizes``) unless
    ``enforce_eager``; the CPU default is :class:`BatchInvariantExactStep`. ``compile_mode`` other
    than ``none`` runs the static step (on any device) compiled by ``torch.compile``
    (:mod:`.compiled_step`); on CUDA the graphs capture the compiled step."""

    def __init__(self, checkpoint: Qwen3TTSCheckpoint, max_num_seqs: int = 8, max_model_len: int = 2048,
                 batch_invariant: bool = True, static_step: Optional[bool] = None,
                 cuda_graph_sizes: Seq[int] = (1, 2, 4, 8, 16), enforce_eager: bool = False,
                 shortest_attention: int = SHORTEST_LENGTH_BUCKET, compile_mode: str = "none") -> None:
        self.checkpoint = checkpoint
        self.config = checkpoint.config
        self.talker = checkpoint.talker
        self.code_predictor = self.talker.code_predictor
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        dtype, device = checkpoint.dtype, checkpoint.device
        self.ops = BatchInvariantOps(enabled=batch_invariant)
        self.cache = self.talker.new_cache(max_num_seqs, max_model_len, dtype, device)
        self.rotary = self.talker.new_rotary(dtype, device)
        self.cp_cache = self.code_predictor.new_cache(max_num_seqs, dtype, device)
        self.cp_rotary = self.code_predictor.new_rotary(dtype, device)
        t = self.config.talker
        self.eos_token_ids = frozenset({t.codec_eos_token_id})
        # The reference counts the codebook-0 token drawn after the last frame in max_new_tokens.
        # Declared by the runner (not mapped by the stage) so every engine caller (stage, benchmarks,
        # parity tests) gets the reference's meaning of max_new_tokens.
        self.max_new_tokens_offset = 1
        self.rules = TokenRules(t.vocab_size, (t.codec_eos_token_id,), t.suppressed_codec_ids, device)
        self.frame_decode = Qwen3Decode(self.talker, self.cp_rotary)
        self.exact = BatchInvariantExactStep(self.frame_decode, self.ops)   # prefill, and the CPU decode
        self.static: Optional[GraphSafeStaticStep] = None
        self.graphs = None
        self._slot_seq: dict[int, Sequence] = {}   # running requests by slot (the static path's waiting rows)
        if compile_mode != "none" and static_step is False:
            raise ValueError("compile_mode compiles the static step: it needs static_step")
        if static_step if static_step is not None else (device.type == "cuda" or compile_mode != "none"):
            self._init_static(cuda_graph_sizes, enabled=device.type == "cuda" and not enforce_eager,
                              shortest_attention=shortest_attention, compile_mode=compile_mode)

    # -- engine interface
    def check(self, prompt: Qwen3Prompt, params: SamplingParams) -> None:
        if not isinstance(prompt, Qwen3Prompt):
            raise TypeError(f"expected a Qwen3Prompt (from PromptBuilder.build), got {type(prompt).__name__}")
        code_predictor_params(params)

    def prompt_length(self, prompt: Qwen3Prompt) -> int:
        return prompt.prefill_length

    def prefill(self, seq: Sequence) -> int:
        embeds = embed_prompt(self.talker, self.config, seq.prompt)
        logits, hidden = self.exact.prefill(embeds.prefill, self.cache, seq.slot, self.rotary)
        return self._start(seq, embeds, logits, hidden)

    def prefill_many(self, seqs: list[Sequence]) -> list[int]:
        """Prefill several admitted requests. On the static (accelerator) path and without
        ``batch_invariant`` they run as one padded forward; the exact CPU path keeps one forward
        per request (bit-identical to the reference)."""
        if (self.static is None and self.ops.enabled) or len(seqs) == 1:
            return [self.prefill(seq) for seq in seqs]
        embeds = [embed_prompt(self.talker, self.config, seq.prompt) for seq in seqs]
        logits, hidden = self.exact.prefill_rows([e.prefill for e in embeds], self.cache,
                                                 [seq.slot for seq in seqs], self.rotary)
        return [self._start(seq, e, logits[i:i + 1], hidden[i:i + 1]) for i, (seq, e) in enumerate(zip(seqs, embeds))]

    def _start(self, seq: Sequence, embeds, logits: torch.Tensor, hidden: torch.Tensor) -> int:
        """The request's state after its prefill, and its first codebook-0 token."""
        token = self._select_cb0(logits, [], seq)
        text_open = seq.prompt.text_open
        text = TrailingText(embeds.trailing_text[0], embeds.tts_pad[0], closed=not text_open,
                            tts_eos=embeds.tts_eos[0] if text_open else None)
        seq.state = _RequestState(prefill_length=embeds.prefill.shape[1], text=text, past_hidden=hidden,
                                  pending=token, generated=[token], code_predictor=code_predictor_params(seq.params))
        self._slot_seq[seq.slot] = seq
        return token

    def extend(self, seq: Sequence, items: list, end: bool) -> None:
        """Text ids that became final (each item a list of ids), embedded one by one."""
        st: _RequestState = seq.state
        ids = [int(i) for item in items for i in item]
        if ids:
            device = self.talker.codec_head.weight.device
            st.text.extend(embed_text_ids(self.talker, ids, device)[0])
        if end:
            st.text.close()

    def ready(self, seq: Sequence) -> bool:
        """A step that draws the next token feeds the text row of this frame: it must be here."""
        st: _RequestState = seq.state
        return not seq.sample_next or st.text.has_row(st.frame)

    def release(self, seq: Sequence) -> None:
        if seq.slot is not None and self._slot_seq.get(seq.slot) is seq:
            del self._slot_seq[seq.slot]
        seq.state = None

    def decode(self, seqs: list[Sequence]) -> list[StepOutput]:
        if self.static is not None:
            frames, tokens = self._decode_static(seqs)
        else:
            frames, tokens = self._decode_exact(seqs)
        outputs = []
        for seq, frame, token in zip(seqs, frames, tokens):
            if seq.sample_next:   # the state for the next frame (token: its codebook 0)
                st: _RequestState = seq.state
                st.generated.append(token)
                st.pending = token
            outputs.append(StepOutput(seq, frame, token if seq.sample_next else None))
        return outputs

    # -- exact step: the frame's codebooks 1..15, then the talker for requests that go on
    def _decode_exact(self, seqs: list[Sequence]) -> tuple[list[list[int]], list[Optional[int]]]:
        states: list[_RequestState] = [s.state for s in seqs]
        device = self.talker.codec_head.weight.device
        cb0 = torch.tensor([st.pending for st in states], dtype=torch.long, device=device)
        cb0_embed = self.talker.embed_codec(cb0.view(-1, 1))
        codes = self._complete_frames(seqs, states, cb0_embed)
        frames = torch.cat((cb0.view(-1, 1), codes), dim=1).tolist()
        tokens: list[Optional[int]] = [None] * len(seqs)
        going_on = [b for b, seq in enumerate(seqs) if seq.sample_next]
        if going_on:
            self._talker_step(seqs, states, going_on, cb0_embed, codes, tokens)
        return frames, tokens

    def _complete_frames(self, seqs: list[Sequence], states: list[_RequestState],
                         cb0_embed: torch.Tensor) -> torch.Tensor:
        """Codebooks 1..15 of every pending frame: ``[B, 15]``."""
        params = [st.code_predictor for st in states]
        sample = [p.subtalker_do_sample for p in params]
        past_hidden = torch.cat([st.past_hidden for st in states], dim=0)
        if not any(sample):  # all greedy: one argmax per step (traced on CPU)
            return self.exact.greedy_codes(past_hidden, cb0_embed, self.cp_cache)
        temperature = [p.subtalker_temperature for p in params]
        top_k = [p.subtalker_top_k for p in params]
        top_p = [p.subtalker_top_p for p in params]
        generators = [s.generator for s in seqs]
        return self.exact.sampled_codes(
            past_hidden, cb0_embed, self.cp_cache,
            lambda step, logits: select_rows(logits, sample, temperature, top_k, top_p, generators))

    def _talker_step(self, seqs: list[Sequence], states: list[_RequestState], rows: list[int],
                     cb0_embed: torch.Tensor, codes: torch.Tensor, tokens: list[Optional[int]]) -> None:
        """Codebook 0 of the next frame of ``rows`` into ``tokens``."""
        if len(rows) == len(seqs):   # everyone goes on (the usual case): no row selection
            sub_codes, sub_cb0 = codes, cb0_embed
        else:
            index = torch.tensor(rows, dtype=torch.long, device=codes.device)
            sub_codes, sub_cb0 = codes.index_select(0, index), cb0_embed.index_select(0, index)
        text = [states[b].text.row(states[b].frame) for b in rows]
        embeds = self.exact.next_talker_input(sub_cb0, sub_codes, torch.stack(text, dim=0))
        slots = [seqs[b].slot for b in rows]
        positions = [states[b].prefill_length + states[b].frame for b in rows]
        logits, hidden = self.exact.talker_decode(embeds, self.cache, slots, positions, self.rotary)
        for i, b in enumerate(rows):
            seq, st = seqs[b], states[b]
            tokens[b] = self._select_cb0(logits[i:i + 1], st.generated, seq)
            st.past_hidden = hidden[i:i + 1]

    # -- static step (CUDA graphs)
    def _init_static(self, sizes: Seq[int], enabled: bool, shortest_attention: int, compile_mode: str) -> None:
        from omni_backend.engine.cuda_graphs import GraphBuckets, bucket_sizes

        # a masked-out key still multiplies its value by 0: unwritten (uninitialised) positions must be finite
        for buffer in self.cache.keys + self.cache.values:
            buffer.zero_()
        self.static = GraphSafeStaticStep(self.frame_decode, self.cache, self.cp_cache, self.rotary, self.max_num_seqs,
                                          self.max_model_len, self.rules)
        self._row_owner: list[Optional[Sequence]] = [None] * self.max_num_seqs
        # variants: (sample, attention length): sample False = every row greedy (no sort / softmax
        # in the graph); the length bucket holds the batch's furthest position
        self.lengths = length_buckets(self.max_model_len, shortest_attention)
        variants = [(sample, length) for sample in (False, True) for length in self.lengths]
        step = self.static.run
        if compile_mode != "none":   # the graphs capture the compiled step (compiled_step.py)
            from .compiled_step import compile_static_step

            buckets = len(bucket_sizes(sizes, self.max_num_seqs))
            step = compile_static_step(self.static, compile_mode, len(variants) * buckets)
            logger.info("frame step: torch.compile mode %s (%d buckets x %d variants)", compile_mode, buckets,
                        len(variants))
        self.graphs = GraphBuckets(step, sizes, self.max_num_seqs, variants=variants,
                                   enabled=enabled, device=self.checkpoint.device)
        with torch.inference_mode():
            try:
                self.graphs.capture(prepare=self._idle_rows)
            except Exception:  # serve eagerly rather than not at all; the graph check reports 0 graphs
                logger.exception("CUDA graph capture failed; the static step runs eagerly")
                self.graphs.graphs.clear()
                self.graphs.enabled = False

    def _idle_rows(self, size: int) -> None:
        """Harmless inputs for rows no request owns (capture warm-up)."""
        self.static.position[:size].zero_()
        self.static.generated[:size].zero_()
        self.static.ban_eos[:size].zero_()
        self._row_owner[:size] = [None] * size

    def _decode_static(self, seqs: list[Sequence]) -> tuple[list[list[int]], list[Optional[int]]]:
        static = self.static
        rows = max(s.slot for s in seqs) + 1
        size = self.graphs.bucket(rows)
        position = [0] * size      # idle rows write into position 0 of their own (unused) slot
        generated = [0] * size
        ban_eos = [False] * size
        texts, text_rows, sample = [], [], False
        for seq in seqs:
            st: _RequestState = seq.state
            b, p = seq.slot, seq.params
            if self._row_owner[b] is not seq:
                static.set_row(b, st.pending, st.past_hidden, st.generated, p, st.code_predictor, seq.seed)
                self._row_owner[b] = seq
            t = st.frame
            pos = st.prefill_length + t
            position[b] = pos if pos < self.max_model_len else 0   # such a row ends this step anyway
            generated[b] = len(st.generated)
            ban_eos[b] = seq.ban_eos
            texts.append(st.text.row(t) if seq.sample_next else st.text.tts_pad)
            text_rows.append(b)
            sample = sample or bool(p.do_sample or st.code_predictor.subtalker_do_sample)
        stepping = {seq.slot for seq in seqs}
        for b in range(size):   # requests waiting for text inside the bucket: padding rows
            other = self._slot_seq.get(b)
            if other is None or b in stepping:
                continue
            st = other.state
            if self._row_owner[b] is other:   # the buffers hold its live state: keep it for its next step
                st.past_hidden = static.hidden[b:b + 1].clone()
                self._row_owner[b] = None
            # its next step writes this position again before reading it
            position[b] = min(st.prefill_length + st.frame, self.max_model_len - 1)
        device = static.device
        static.position[:size].copy_(torch.tensor(position, dtype=torch.long))
        static.generated[:size].copy_(torch.tensor(generated, dtype=torch.long))
        static.ban_eos[:size].copy_(torch.tensor(ban_eos, dtype=torch.bool))
        static.text.index_copy_(0, torch.tensor(text_rows, dtype=torch.long, device=device),
                                torch.stack(texts).to(static.text.dtype))
        length = self.lengths[bisect.bisect_right(self.lengths, max(position))]  # > every position
        self.graphs.run(rows, sample, length)
        result = static.codes[:size].tolist()
        rows = [result[seq.slot] for seq in seqs]
        return [row[:-1] for row in rows], [row[-1] for row in rows]

    def _select_cb0(self, logits: torch.Tensor, generated: list[int], seq: Sequence) -> int:
        params = seq.params
        scores = self.rules.apply(logits, generated, params.repetition_penalty, seq.ban_eos)
        return select(scores, params.do_sample, params.temperature, params.top_k, params.top_p, seq.generator)


def create_engine(checkpoint: Qwen3TTSCheckpoint | str, max_num_seqs: int = 8, max_model_len: int = 2048,
                  num_threads: Optional[int] = None, dtype: torch.dtype | str = torch.float32,
                  device: torch.device | str = "cpu", max_prefills_per_step: int = 1,
                  batch_invariant: bool = True, cuda_graph_sizes: Optional[Seq[int]] = None,
                  enforce_eager: bool = False, static_step: Optional[bool] = None,
                  shortest_attention: int = SHORTEST_LENGTH_BUCKET,
                  max_input_wait_s: Optional[float] = None, compile_mode: str = "none") -> AREngine:
    """An :class:`AREngine` over a checkpoint (a loaded one or a folder path). The engine's default
    sampling parameters are the checkpoint's ``generation_config.json``. On CUDA the decode step
    is captured as CUDA graphs per ``cuda_graph_sizes`` bucket and attention length (doubling
    from ``shortest_attention`` up to ``max_model_len``) here, before the engine serves
    (``enforce_eager`` runs the same static step without graphs). ``compile_mode``: see
    :class:`Qwen3TTSRunner`."""
    if num_threads is not None:
        torch.set_num_threads(int(num_threads))
    if isinstance(checkpoint, str):
        checkpoint = load_checkpoint(checkpoint, dtype=dtype, device=device)
    runner = Qwen3TTSRunner(checkpoint, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                            batch_invariant=batch_invariant, static_step=static_step,
                            cuda_graph_sizes=tuple(cuda_graph_sizes) if cuda_graph_sizes else (1, 2, 4, 8, 16),
                            enforce_eager=enforce_eager, shortest_attention=shortest_attention,
                            compile_mode=compile_mode)
    return AREngine(runner, max_prefills_per_step=max_prefills_per_step, num_threads=num_threads,
                    default_params=sampling_params_from_defaults(checkpoint.generation),
                    max_input_wait_s=max_input_wait_s)
