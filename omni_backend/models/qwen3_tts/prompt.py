"""Qwen3-TTS prompts: request fields -> validated token ids (:class:`PromptBuilder`) -> talker
input embeddings (:func:`embed_prompt`).

The talker's input at each position is a text-channel embedding plus a codec-channel one:

1. optional instruction ``<|im_start|>user\\n{instruct}<|im_end|>\\n`` (text channel only);
2. ``<|im_start|>assistant\\n`` (text channel only);
3. the codec prefix ``[nothink, think_bos, think_eos]`` (language auto) or
   ``[think, think_bos, language, think_eos]``, the speaker slot (preset speaker embedding, or an
   x-vector for voice cloning), then ``[pad, bos]``; the text channel carries ``tts_pad``, and
   ``tts_bos`` over the codec ``pad``;
4. streaming-text mode: first text token + codec ``bos``; the other text tokens, then
   ``tts_eos``, then ``tts_pad`` are added one per generated frame ("trailing text").
   Non-streaming mode: all text tokens + ``tts_eos`` over codec ``pad``, then ``tts_pad`` +
   codec ``bos``; the trailing text is ``tts_pad`` only.

Text that arrives in pieces (``PromptBuilder.build(streamed_ids=...)``, streaming-text mode only):
the prompt holds the text ids final so far (:class:`~.streamed_text.StreamedText`) and is
``text_open``: its trailing text is those after the first, each embedded on its own, and grows as
more ids arrive (the runner's ``extend``); ``tts_eos`` follows only when the text ends. Embedding
each id alone makes a row's bits independent of how the text was cut into pieces.

The embedding maths is the reference ``generate()``'s, in the same tensor shapes (on CPU the
bits of a matmul depend on its row count), so the prefill is bit-identical.

Voice cloning (``base`` checkpoints, the reference ``generate_voice_clone``): the speaker slot
holds the x-vector of the reference recording. In x-vector-only mode the rest is as above. In
in-context (ICL) mode step 4 is replaced: the text channel carries the reference transcript's
tokens, then the text's, then ``tts_eos``; the codec channel carries ``bos`` then, per reference
frame, the sum of its 16 codebook embeddings. Streaming-text mode (the wrapper's default) adds
the two channels position by position over the codec's length (text beyond it becomes trailing
text; a shorter text is padded with ``tts_pad``); non-streaming mode puts the whole text over
codec ``pad``, then the codec part over ``tts_pad``. The generated audio continues the reference
recording, whose part the caller cuts off (:func:`reference_cut_samples`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from omni_backend.errors import InvalidRequest

from .config import Qwen3TTSConfig
from omni_backend.models.qwen3_common.tokenizer import QwenTextTokenizer, assistant_text, instruct_text

__all__ = [
    "PromptError",
    "VoiceClonePrompt",
    "Qwen3Prompt",
    "PromptBuilder",
    "PromptEmbeddings",
    "embed_prompt",
    "embed_text_ids",
    "reference_cut_samples",
]

# ISO 639-1 codes clients send for the languages the released checkpoints name ("en", "zh-CN")
LANGUAGE_CODES = {"zh": "chinese", "en": "english", "de": "german", "it": "italian", "pt": "portuguese",
                  "es": "spanish", "ja": "japanese", "ko": "korean", "fr": "french", "ru": "russian"}


def language_name(language: str) -> str:
    """A language as the checkpoint names it: the name itself, or the name of an ISO 639-1 code
    (a region after `-` or `_` is dropped)."""
    code = language.replace("_", "-").split("-", 1)[0]
    return LANGUAGE_CODES.get(code, language) if len(code) == 2 else language


# Length of the assistant wrapper around the text: 3 tokens before ("<|im_start|>assistant\n"),
# 5 after ("<|im_end|>\n<|im_start|>assistant\n").
_ROLE_TOKENS = 3
_TAIL_TOKENS = 5


class PromptError(InvalidRequest, ValueError):
    """A request field the checkpoint cannot serve. ``field`` names it (``input``, ``voice``,
    ``language``, ``instructions``, ``task_type``); ``str(error)`` is
    ``"invalid_request: <field>: <message>"``."""


@dataclass(frozen=True)
class VoiceClonePrompt:
    """A voice to clone on a ``base`` checkpoint: the speaker slot takes ``speaker_embedding`` (the
    x-vector, talker hidden size); in-context (ICL) mode (``x_vector_only=False``) adds the
    reference transcript over the codec embeddings of ``ref_codes`` ``[T, 16]``. ``ref_text`` is
    the transcript; :meth:`PromptBuilder.build` tokenizes it into ``ref_text_ids``."""

    speaker_embedding: Optional[torch.Tensor]
    ref_codes: Optional[torch.Tensor] = None
    ref_text_ids: Optional[tuple[int, ...]] = None
    x_vector_only: bool = True
    ref_text: Optional[str] = None

    @property
    def icl(self) -> bool:
        return not self.x_vector_only and self.ref_codes is not None


@dataclass(frozen=True)
class Qwen3Prompt:
    """A validated request in token ids, ready to embed."""

    input_ids: tuple[int, ...]                 # tokenized assistant text (wrapper included)
    instruct_ids: Optional[tuple[int, ...]]    # tokenized instruction text, or None
    codec_prefix: tuple[int, ...]              # think/nothink ... think_eos
    speaker_codec_id: Optional[int]            # codec id of the preset speaker, or None
    non_streaming_mode: bool
    language: str                              # normalised ("auto", "english", ...)
    speaker: Optional[str]                     # normalised preset speaker name
    voice_clone: Optional[VoiceClonePrompt] = None
    text_open: bool = False                    # more text follows (text that arrives in pieces)

    @property
    def text_ids(self) -> tuple[int, ...]:
        """The ids of the text itself (between the assistant wrapper)."""
        return self.input_ids[_ROLE_TOKENS:-_TAIL_TOKENS]

    @property
    def prefill_length(self) -> int:
        """Positions of the prefill (talker input length)."""
        instruct = len(self.instruct_ids) if self.instruct_ids else 0
        clone = self.voice_clone
        has_speaker = self.speaker_codec_id is not None or (clone is not None and clone.speaker_embedding is not None)
        codec = len(self.codec_prefix) + (1 if has_speaker else 0) + 2
        length = instruct + _ROLE_TOKENS + codec - 1
        if clone is not None and clone.icl:
            codec_len = 1 + int(clone.ref_codes.shape[0])
            text_len = len(clone.ref_text_ids or ()) + len(self.text_ids) + 1
            return length + codec_len + (text_len if self.non_streaming_mode else 0)
        length += 1
        if self.non_streaming_mode:
            length += len(self.text_ids) + 1
        return length


class PromptBuilder:
    """Validates request fields against a checkpoint and tokenizes them as the reference wrappers
    (``generate_custom_voice`` / ``generate_voice_design``) do."""

    def __init__(self, config: Qwen3TTSConfig, tokenizer: QwenTextTokenizer) -> None:
        self.config = config
        self.tokenizer = tokenizer

    @property
    def speakers(self) -> tuple[str, ...]:
        return self.config.speakers

    @property
    def languages(self) -> tuple[str, ...]:
        return self.config.languages

    def build(self, text: str, speaker: Optional[str] = None, language: Optional[str] = None,
              instruct: Optional[str] = None, non_streaming_mode: Optional[bool] = None,
              voice_clone: Optional[VoiceClonePrompt] = None,
              streamed_ids: Optional[Sequence[int]] = None) -> Qwen3Prompt:
        """``non_streaming_mode=None`` takes the reference wrapper's default: True for
        custom_voice and voice_design, False for base (voice clone). ``streamed_ids``: the text
        arrives in pieces; these are the ids of ``assistant\n{text}`` final so far
        (:class:`~.streamed_text.StreamedText`, at least one text id), ``text`` what arrived; the
        prompt is ``text_open`` (streaming-text mode, no in-context voice clone)."""
        cfg = self.config
        kind = cfg.tts_model_type
        if not isinstance(text, str) or not text.strip():
            raise PromptError("input", "must be a non-empty string")
        if streamed_ids is not None:
            if non_streaming_mode:
                raise PromptError("non_streaming_mode", "text that arrives in pieces is read in streaming-text "
                                                        "mode; non_streaming_mode must be false")
            non_streaming_mode = False
            if voice_clone is not None and not voice_clone.x_vector_only:
                raise PromptError("streaming_input", "in-context voice cloning needs the whole text in its "
                                                     "prompt; clone with x_vector_only_mode, or send the text whole")
        if non_streaming_mode is None:
            non_streaming_mode = kind != "base"

        # -- voice
        speaker_name = None
        if kind == "base":
            if voice_clone is None:
                raise PromptError("ref_audio", "this is a base (voice clone) checkpoint: give ref_audio "
                                               "(and ref_text), or a registered voice")
            if speaker is not None and str(speaker).strip() != "":
                raise PromptError("voice", "the base checkpoint has no preset speakers; clone a voice with ref_audio")
            if instruct is not None and str(instruct).strip() != "":
                raise PromptError("instructions", "the base (voice clone) checkpoint takes no instructions")
            instruct = None
            voice_clone = self._tokenized_clone(voice_clone)
        elif voice_clone is not None:
            raise PromptError("ref_audio", f"voice cloning needs a base checkpoint; this one is {kind}")
        if kind == "custom_voice":
            if speaker is None or str(speaker).strip() == "":
                raise PromptError("voice", f"required; available: {', '.join(self.speakers)}")
            speaker_name = str(speaker).strip().lower()
            if speaker_name not in {s.lower() for s in cfg.talker.spk_id}:
                raise PromptError("voice", f"unknown speaker {speaker!r}; available: {', '.join(self.speakers)}")
        elif speaker is not None and str(speaker).strip() != "":
            raise PromptError("voice", f"the {kind} checkpoint has no preset speakers (got {speaker!r}); "
                                       "describe the voice in instructions")

        # -- language
        lang = "auto" if language is None or str(language).strip() == "" else str(language).strip().lower()
        if lang not in self.languages:
            lang = language_name(lang)
        if lang not in self.languages:
            raise PromptError("language", f"unknown language {language!r}; available: {', '.join(self.languages)} "
                                          "(or their ISO 639-1 codes)")

        # -- instructions
        if instruct is not None and not isinstance(instruct, str):
            raise PromptError("instructions", "must be a string")
        if kind == "voice_design" and (instruct is None or instruct.strip() == ""):
            raise PromptError("instructions", "required by the voice_design checkpoint (describe the voice)")
        if cfg.ignores_instructions:
            instruct = None  # the 0.6B CustomVoice model takes no instruction (reference wrapper rule)
        instruct_ids = tuple(self.tokenizer.encode(instruct_text(instruct))) if instruct else None

        # -- codec prefix: language (the dialect rule applies to dialect speakers) and speaker
        t = cfg.talker
        language_id = None if lang == "auto" else t.codec_language_id[lang]
        if speaker_name is not None and lang in ("chinese", "auto"):
            dialect = _lookup(t.spk_is_dialect, speaker_name)
            if dialect not in (False, None):
                language_id = t.codec_language_id[dialect]
        if language_id is None:
            prefix = (t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id)
        else:
            prefix = (t.codec_think_id, t.codec_think_bos_id, language_id, t.codec_think_eos_id)
        speaker_codec_id = _lookup(t.spk_id, speaker_name) if speaker_name is not None else None

        if streamed_ids is None:
            input_ids = tuple(self.tokenizer.encode(assistant_text(text)))
        else:   # <|im_start|>, the final ids of "assistant\n{text}", then the fixed tail
            tail = tuple(self.tokenizer.encode(assistant_text("")))[_ROLE_TOKENS:]
            input_ids = (self.tokenizer.token_to_id("<|im_start|>"), *streamed_ids, *tail)
        if len(input_ids) <= _ROLE_TOKENS + _TAIL_TOKENS:
            raise PromptError("input", "has no text tokens")
        return Qwen3Prompt(input_ids=input_ids, instruct_ids=instruct_ids, codec_prefix=prefix,
                           speaker_codec_id=speaker_codec_id, non_streaming_mode=bool(non_streaming_mode),
                           language=lang, speaker=speaker_name, voice_clone=voice_clone,
                           text_open=streamed_ids is not None)

    def _tokenized_clone(self, clone: VoiceClonePrompt) -> VoiceClonePrompt:
        """Checks a voice-clone prompt and tokenizes its transcript as the reference wrapper does
        (``<|im_start|>assistant\n{ref_text}<|im_end|>\n``, without the 3 leading and 2 trailing
        tokens)."""
        hidden = self.config.talker.hidden_size
        if clone.speaker_embedding is None or tuple(clone.speaker_embedding.shape) != (hidden,):
            raise PromptError("ref_audio", f"the speaker embedding must have shape ({hidden},)")
        if clone.x_vector_only:
            return VoiceClonePrompt(speaker_embedding=clone.speaker_embedding, x_vector_only=True)
        if clone.ref_codes is None or clone.ref_codes.ndim != 2 or clone.ref_codes.shape[1] != 16 \
                or clone.ref_codes.shape[0] == 0:
            raise PromptError("ref_audio", "in-context cloning needs reference codes [frames, 16]")
        ids = clone.ref_text_ids
        if ids is None:
            if clone.ref_text is None or not str(clone.ref_text).strip():
                raise PromptError("ref_text", "required for in-context voice cloning (the transcript of "
                                              "ref_audio), unless x_vector_only_mode is true")
            ids = tuple(self.tokenizer.encode(f"<|im_start|>assistant\n{clone.ref_text}<|im_end|>\n"))[3:-2]
        return VoiceClonePrompt(speaker_embedding=clone.speaker_embedding, ref_codes=clone.ref_codes,
                                ref_text_ids=tuple(ids), x_vector_only=False, ref_text=clone.ref_text)


def _lookup(table, name: str):
    for key, value in table.items():
        if str(key).lower() == name:
            return value
    return None


@dataclass
class PromptEmbeddings:
    """Talker inputs of one request: the prefill ``[1, L, hidden]``, the trailing text added one row
    per generated frame ``[1, T, hidden]``, and ``tts_pad`` ``[1, 1, hidden]`` used after it.
    ``tts_eos`` ``[1, 1, hidden]`` ends a text that arrives in pieces (``Qwen3Prompt.text_open``:
    its trailing text holds no ``tts_eos`` yet)."""

    prefill: torch.Tensor
    trailing_text: torch.Tensor
    tts_pad: torch.Tensor
    tts_eos: Optional[torch.Tensor] = None


def embed_text_ids(talker, ids: Sequence[int], device: torch.device) -> torch.Tensor:
    """Text ids embedded one at a time, ``[1, len(ids), hidden]``: on CPU a row's bits depend on
    the matmul's row count, so text that arrives in pieces is embedded in one shape whatever the
    pieces are."""
    rows = [talker.embed_text(torch.tensor([[i]], dtype=torch.long, device=device)) for i in ids]
    if not rows:
        return talker.embed_text(torch.zeros((1, 0), dtype=torch.long, device=device))
    return torch.cat(rows, dim=1)


def embed_prompt(talker, config: Qwen3TTSConfig, prompt: Qwen3Prompt) -> PromptEmbeddings:
    """The reference ``generate()``'s prompt embedding for one request (see the module doc)."""
    t = config.talker
    device = talker.codec_head.weight.device

    def ids(values) -> torch.Tensor:
        return torch.tensor([list(values)], dtype=torch.long, device=device)

    input_id = ids(prompt.input_ids)
    parts = []
    if prompt.instruct_ids:
        parts.append(talker.embed_text(ids(prompt.instruct_ids)))

    tts_bos, tts_eos, tts_pad = talker.embed_text(
        ids([config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id])).chunk(3, dim=1)
    codec_prefix = talker.embed_codec(ids(prompt.codec_prefix))
    codec_tail = talker.embed_codec(ids([t.codec_pad_id, t.codec_bos_id]))
    if prompt.voice_clone is not None and prompt.voice_clone.speaker_embedding is not None:
        speaker = prompt.voice_clone.speaker_embedding.to(device=device, dtype=codec_prefix.dtype)
    elif prompt.speaker_codec_id is not None:
        speaker = talker.embed_codec(torch.tensor(prompt.speaker_codec_id, dtype=torch.long, device=device))
    else:
        speaker = None
    if speaker is None:
        codec = torch.cat([codec_prefix, codec_tail], dim=1)
    else:
        codec = torch.cat([codec_prefix, speaker.view(1, 1, -1), codec_tail], dim=1)

    role = talker.embed_text(input_id[:, :_ROLE_TOKENS])
    body = torch.cat((tts_pad.expand(-1, codec.shape[1] - 2, -1), tts_bos), dim=1) + codec[:, :-1]
    embeds = torch.cat((role, body), dim=1)
    text_start, text_end = _ROLE_TOKENS, input_id.shape[1] - _TAIL_TOKENS
    clone = prompt.voice_clone
    if clone is not None and clone.icl:
        icl, trailing = _embed_icl(talker, config, input_id[:, text_start:text_end], ids(clone.ref_text_ids),
                                   clone.ref_codes.to(device=device, dtype=torch.long), tts_pad, tts_eos,
                                   prompt.non_streaming_mode)
        embeds = torch.cat([embeds, icl], dim=1)
    elif prompt.non_streaming_mode:
        text = torch.cat((talker.embed_text(input_id[:, text_start:text_end]), tts_eos), dim=1)
        n_text = text_end - text_start + 1
        embeds = torch.cat([
            embeds,
            text + talker.embed_codec(ids([t.codec_pad_id] * n_text)),
            tts_pad + talker.embed_codec(ids([t.codec_bos_id])),
        ], dim=1)
        trailing = tts_pad
    else:
        first = talker.embed_text(input_id[:, text_start:text_start + 1]) + codec[:, -1:]
        embeds = torch.cat([embeds, first], dim=1)
        if prompt.text_open:   # the rest arrives later; tts_eos when it ends
            trailing = embed_text_ids(talker, prompt.input_ids[text_start + 1:text_end], device)
        else:
            trailing = torch.cat((talker.embed_text(input_id[:, text_start + 1:text_end]), tts_eos), dim=1)
    parts.append(embeds)
    prefill = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
    return PromptEmbeddings(prefill=prefill, trailing_text=trailing, tts_pad=tts_pad, tts_eos=tts_eos)


def _embed_icl(talker, config: Qwen3TTSConfig, text_ids: torch.Tensor, ref_ids: torch.Tensor, ref_codes: torch.Tensor,
               tts_pad: torch.Tensor, tts_eos: torch.Tensor, non_streaming_mode: bool):
    """The in-context part of a voice-clone prompt and its trailing text (module doc)."""
    t = config.talker
    device = ref_codes.device
    text = torch.cat([talker.embed_text(torch.cat([ref_ids, text_ids], dim=-1)), tts_eos], dim=1)
    # per reference frame, the 16 codebook embeddings ([T, 16, hidden]) summed
    per_codebook = [talker.embed_codec(ref_codes[:, :1])] + talker.code_predictor.embed_codes(ref_codes[:, 1:])
    frames = torch.cat(per_codebook, dim=1).sum(1).unsqueeze(0)
    bos = talker.embed_codec(torch.tensor([[t.codec_bos_id]], dtype=torch.long, device=device))
    codec = torch.cat([bos, frames], dim=1)
    text_len, codec_len = text.shape[1], codec.shape[1]
    if non_streaming_mode:
        pads = talker.embed_codec(torch.tensor([[t.codec_pad_id] * text_len], dtype=torch.long, device=device))
        return torch.cat([text + pads, codec + tts_pad], dim=1), tts_pad
    if text_len > codec_len:
        return text[:, :codec_len] + codec, text[:, codec_len:]
    text = torch.cat([text] + [tts_pad] * (codec_len - text_len), dim=1)
    return text + codec, tts_pad


def reference_cut_samples(ref_frames: int, new_frames: int, samples: int) -> int:
    """Samples to drop from the front of the decode of ``ref codes + new codes`` (``samples`` long):
    the reference wrapper's proportional cut, ``int(ref / total * samples)``."""
    total = ref_frames + new_frames
    return int(ref_frames / max(total, 1) * samples)
