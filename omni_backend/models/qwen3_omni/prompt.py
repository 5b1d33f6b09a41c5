"""Qwen3-Omni prompts: chat input -> thinker prompt ids (:class:`PromptBuilder`), and thinker output
-> the talker's input (:class:`TalkerInput`).

Thinker prompt
--------------
The checkpoint's chat template (``chat_template.jinja``, ``chat_template.json`` or
``tokenizer_config.json``) is rendered as transformers' ``apply_chat_template`` renders it
(sandboxed Jinja, ``trim_blocks`` / ``lstrip_blocks``, ``add_generation_prompt=True``), then
tokenized with the checkpoint's tokenizer. Without a template file the ChatML text-only form is
used: ``<|im_start|>{role}\\n{text}<|im_end|>\\n`` per message, then ``<|im_start|>assistant\\n``.

Talker input (the reference ``Qwen3OmniMoeForConditionalGeneration.generate``)
------------------------------------------------------------------------------
The talker's prefill is, in order:

1. every USER position of the prompt (from a ``<|im_start|>user`` up to the next
   ``<|im_start|>``; system and earlier assistant turns are skipped): ``text_projection`` of the
   thinker's token embedding, or at a multimodal placeholder ``hidden_projection`` of the
   thinker's hidden state ``accept_hidden_layer`` there. ``text_projection`` runs over all prompt
   positions in one matmul, as the reference does;
2. 9 positions from the last ``<|im_start|>assistant`` on: text channel = the projections of its
   first 3 tokens, ``tts_pad`` x4, ``tts_bos``, the projection of the 4th token (the answer's first
   token); codec channel = zeros x3, then the codec embeddings of ``nothink, think_bos, think_eos,
   speaker, pad, bos``.

The trailing text, one row added to each generated frame's input, is the projection of the
assistant tokens from the 5th on, then ``tts_eos``, then ``tts_pad`` for ever. The assistant rows
are the thinker's tokens WITHOUT its last one: the reference takes them from the thinker's
per-step input embeddings, and the last generated token (eos, or the one at the length limit) is
never fed back.

Streaming: the talker can start before the thinker has finished. :class:`TalkerInput` takes the
thinker's tokens as they come (``add``; the caller says which call carries the last token) and
its prefill is ready once enough assistant rows are known; the trailing text is a
:class:`~omni_backend.models.qwen3_common.trailing_text.TrailingText` that grows with the thinker and
closes with ``tts_eos``; a talker row that has used all text that arrived must wait
(``trailing.has_row(frame)``).

Bits: on CPU the bits of a matmul row depend on the matmul's row count M (MKL's sgemm splits M
over threads and handles remainder rows with other kernels). The reference projects the whole
assistant segment at once, with M = its length. Measured here (torch 2.13 CPU): with 1 thread
every M >= 4 gives the same row bits ("common" shapes); with 2 or 8 threads M in {4, 8} and
M >= 12; with 16 threads also not 17-19 and 25-27; multiples of 4 from 12 on were common in every
case. So :class:`TalkerInput` projects rows that arrive while the thinker runs padded with zero
rows to a multiple of 4, at least 12 (:func:`common_shape_rows`), and by default starts the
talker only when 12 assistant rows (9 answer tokens) are known or the thinker has finished (then
the whole segment is projected at once, in the reference's exact shape). Greedy talker codes then
equal the reference whenever the reference's own M was common: always with the parity tests' one
thread. ``start_rows=4`` starts after the first answer token, exact unless the answer is shorter
than 9 tokens.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from omni_backend.errors import InvalidRequest
from omni_backend.models.qwen3_common.tokenizer import QwenTextTokenizer
from omni_backend.models.qwen3_common.trailing_text import TrailingText

from .audio_features import AudioFeatureExtractor
from .config import Qwen3OmniConfig
from .image_processor import ImageProcessor, ProcessedImage
from .media import AudioLimits, ImageLimits, decode_image_url, decode_input_audio

__all__ = [
    "PromptError",
    "ChatTemplate",
    "PromptBuilder",
    "ThinkerPrompt",
    "TalkerInput",
    "COMMON_SHAPE_ROWS",
    "common_shape_rows",
    "ASSISTANT_PREFIX_ROWS",
    "user_positions",
    "assistant_start",
]

# Placeholder texts of the released tokenizer: client text may not spell them.
MEDIA_PLACEHOLDERS = ("<|audio_pad|>", "<|image_pad|>", "<|video_pad|>")
# The smallest "common" row count (see the module docstring).
COMMON_SHAPE_ROWS = 12


def common_shape_rows(count: int) -> int:
    """The row count a projection of ``count`` rows is padded to: a multiple of 4, at least
    :data:`COMMON_SHAPE_ROWS`."""
    return max(COMMON_SHAPE_ROWS, -(-count // 4) * 4)
# The talker prefix takes the first 4 assistant rows (<|im_start|>, assistant, \n, first token).
ASSISTANT_PREFIX_ROWS = 4
ROLES = ("system", "user", "assistant")


class PromptError(InvalidRequest, ValueError):
    """A request field the checkpoint cannot serve; ``str(error)`` is
    ``"invalid_request: <field>: <message>"``."""


# --------------------------------------------------------------------------- chat template


class ChatTemplate:
    """The checkpoint's Jinja chat template, rendered as transformers renders it."""

    def __init__(self, source: str | None, special_tokens: Mapping[str, str] | None = None) -> None:
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self._compiled = None

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str) -> "ChatTemplate":
        source = None
        special: dict[str, str] = {}
        config_path = os.path.join(checkpoint_dir, "tokenizer_config.json")
        tokenizer_config: dict[str, Any] = {}
        if os.path.isfile(config_path):
            with open(config_path, encoding="utf-8") as handle:
                tokenizer_config = json.load(handle)
        for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
            value = tokenizer_config.get(name)
            if isinstance(value, Mapping):
                value = value.get("content")
            if isinstance(value, str):
                special[name] = value
        jinja_path = os.path.join(checkpoint_dir, "chat_template.jinja")
        json_path = os.path.join(checkpoint_dir, "chat_template.json")
        # the processor's template first (what the reference processor uses), then the tokenizer's
        if os.path.isfile(jinja_path):
            with open(jinja_path, encoding="utf-8") as handle:
                source = handle.read()
        elif os.path.isfile(json_path):
            with open(json_path, encoding="utf-8") as handle:
                source = json.load(handle).get("chat_template")
        elif isinstance(tokenizer_config.get("chat_template"), str):
            source = tokenizer_config["chat_template"]
        return cls(source, special)

    def _template(self):
        if self._compiled is None:
            import jinja2.ext
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message: str) -> None:
                raise jinja2.exceptions.TemplateError(message)

            def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
                       sort_keys: bool = False) -> str:
                return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                                  sort_keys=sort_keys)

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[jinja2.ext.loopcontrols])
            env.filters["tojson"] = tojson
            env.globals["raise_exception"] = raise_exception
            env.globals["namespace"] = jinja2.utils.Namespace
            self._compiled = env.from_string(self.source)
        return self._compiled

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        if self.source is None:
            return self._chatml(messages, add_generation_prompt)
        import jinja2

        try:
            return self._template().render(messages=list(messages), tools=None, documents=None,
                                           add_generation_prompt=add_generation_prompt, **self.special_tokens)
        except jinja2.exceptions.TemplateError as error:
            raise PromptError("messages", f"the chat template refused them: {error}") from None

    @staticmethod
    def _chatml(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
        parts = [f"<|im_start|>{m['role']}\n{_text_of(m['content'])}<|im_end|>\n" for m in messages]
        if add_generation_prompt:
            parts.append("<|im_start|>assistant\n")
        return "".join(parts)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    spans = {"audio": "<|audio_start|><|audio_pad|><|audio_end|>", "image": "<|vision_start|><|image_pad|><|vision_end|>"}
    return "".join(spans[part["type"]] if part["type"] in spans else part["text"] for part in content)


# --------------------------------------------------------------------------- thinker prompt


@dataclass
class ThinkerPrompt:
    """Thinker input: token ids with each audio placeholder expanded to one id per audio token, and
    the log-mel features of the recordings, in prompt order (the audio tower turns them into the
    embeddings of those tokens)."""

    ids: list[int]
    audio_features: list[torch.Tensor] = field(default_factory=list)  # [mel_bins, frames] each
    images: list[ProcessedImage] = field(default_factory=list)         # patches and grid each
    # the thinker layer whose hidden states at the placeholders the talker reads (None: not wanted),
    # and those rows once the prefill ran ([placeholders, hidden], float32)
    hidden_layer: int | None = None
    media_hidden: torch.Tensor | None = None

    @property
    def multimodal(self) -> bool:
        return bool(self.audio_features or self.images)

    def __len__(self) -> int:
        return len(self.ids)


class PromptBuilder:
    """Chat input -> thinker prompt. A message's content is a string or a list of parts:
    ``{"type": "text", "text": ...}``, ``{"type": "input_audio", "input_audio": {"data": base64,
    "format": ...}}`` and ``{"type": "image_url", "image_url": {"url": "data:image/...;base64,..."}}``
    (OpenAI's), or in process ``{"type": "audio", "audio": <float32 waveform at the feature
    extractor's rate>}`` and ``{"type": "image", "image": <PIL image>}``."""

    def __init__(self, config: Qwen3OmniConfig, tokenizer: QwenTextTokenizer, template: ChatTemplate,
                 features: AudioFeatureExtractor | None = None, limits: AudioLimits = AudioLimits(),
                 images: ImageProcessor | None = None, image_limits: ImageLimits = ImageLimits()) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.template = template
        self.features = features or AudioFeatureExtractor()
        self.limits = limits
        self.images = images or ImageProcessor()
        self.image_limits = image_limits

    def messages(self, messages: Sequence[Mapping[str, Any]] | None = None, prompt: str | None = None,
                 system: str | None = None) -> list[dict[str, Any]]:
        """The validated message list: ``messages`` or one user message ``prompt`` (exactly one of
        them), after an optional ``system`` message. Audio parts come back decoded
        (``{"type": "audio", "audio": waveform}``)."""
        if (messages is None) == (prompt is None):
            raise PromptError("messages", "give either messages or a prompt")
        out: list[dict[str, Any]] = []
        if system is not None:
            if not isinstance(system, str):
                raise PromptError("system", "must be a string")
            out.append({"role": "system", "content": system})
        if prompt is not None:
            if not isinstance(prompt, str) or not prompt.strip():
                raise PromptError("prompt", "must be a non-empty string")
            out.append({"role": "user", "content": prompt})
            return out
        if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
            raise PromptError("messages", "must be a non-empty list of {role, content}")
        recordings = pictures = 0
        for index, message in enumerate(messages):
            where = f"messages[{index}]"
            if not isinstance(message, Mapping):
                raise PromptError(where, "must be an object with role and content")
            role, content = message.get("role"), message.get("content")
            if role not in ROLES:
                raise PromptError(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
            content = self._content(content, f"{where}.content", media=role == "user")
            if not isinstance(content, str):
                recordings += sum(part["type"] == "audio" for part in content)
                pictures += sum(part["type"] == "image" for part in content)
                if recordings > self.limits.max_recordings:
                    raise PromptError(f"{where}.content", f"more than {self.limits.max_recordings} recordings "
                                                          "in one conversation")
                if pictures > self.image_limits.max_images:
                    raise PromptError(f"{where}.content", f"more than {self.image_limits.max_images} images "
                                                          "in one conversation")
            out.append({"role": role, "content": content})
        if out[-1]["role"] == "assistant":
            raise PromptError("messages", "the last message must not be the assistant's (the answer is generated)")
        if not any(m["role"] == "user" for m in out):
            raise PromptError("messages", "needs a user message")
        return out

    def _content(self, content: Any, where: str, media: bool) -> Any:
        if isinstance(content, str):
            _check_text(content, where, self.config)
            return content
        if not isinstance(content, Sequence) or isinstance(content, bytes) or not content:
            raise PromptError(where, "must be a string or a non-empty list of content parts")
        parts = []
        for index, part in enumerate(content):
            at = f"{where}[{index}]"
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind == "text" and isinstance(part.get("text"), str):
                _check_text(part["text"], f"{at}.text", self.config)
                parts.append({"type": "text", "text": part["text"]})
            elif kind in ("input_audio", "audio", "image_url", "image") and not media:
                raise PromptError(at, "media (audio, images) is read in user messages only")
            elif kind == "image_url":
                if self.config.vision is None:
                    raise PromptError(at, "this checkpoint has no vision encoder (thinker_config.vision_config)")
                image = decode_image_url(part, at, self.image_limits)
                parts.append({"type": "image", "image": image, "processed": self._process_image(image, at)})
            elif kind == "image" and hasattr(part.get("image"), "getbands"):
                parts.append({"type": "image", "image": part["image"],
                              "processed": self._process_image(part["image"], at)})
            elif kind == "input_audio":
                if self.config.audio is None:
                    raise PromptError(at, "this checkpoint has no audio encoder (thinker_config.audio_config)")
                recording = decode_input_audio(part, at, self.features.sampling_rate, self.features.hop_length,
                                               self.limits)
                parts.append({"type": "audio", "audio": recording.waveform})
            elif kind == "audio" and hasattr(part.get("audio"), "shape"):
                parts.append({"type": "audio", "audio": np.asarray(part["audio"], dtype=np.float32).reshape(-1)})
            else:
                raise PromptError(at, "must be {type: text, text}, {type: input_audio, input_audio: "
                                      "{data, format}} or {type: image_url, image_url: {url}}")
        return parts

    def _process_image(self, image, at: str) -> ProcessedImage:
        try:
            return self.images(image)
        except ValueError as error:   # smart_resize's aspect-ratio bound
            raise PromptError(at, f"cannot be processed: {error}") from None

    def text(self, messages: Sequence[Mapping[str, Any]] | None = None, prompt: str | None = None,
             system: str | None = None) -> str:
        return self._render(self.messages(messages, prompt, system))

    def _render(self, messages: list[dict[str, Any]]) -> str:
        rendered = [m if isinstance(m["content"], str) else
                    {"role": m["role"], "content": [{"type": p["type"]} if p["type"] in ("audio", "image") else p
                                                    for p in m["content"]]}
                    for m in messages]
        return self.template.render(rendered, add_generation_prompt=True)

    def build_prompt(self, messages: Sequence[Mapping[str, Any]] | None = None, prompt: str | None = None,
                     system: str | None = None) -> ThinkerPrompt:
        """The thinker prompt (ids ending with ``<|im_start|>assistant\\n``): the template's text
        tokenized, each ``<|audio_pad|>`` expanded to the recording's audio token count (as the
        reference processor expands it), and the recordings' features."""
        validated = self.messages(messages, prompt, system)
        ids = self.tokenizer.encode(self._render(validated))
        media = [p for m in validated if not isinstance(m["content"], str) for p in m["content"]
                 if p["type"] in ("audio", "image")]
        recordings = [p["audio"] for p in media if p["type"] == "audio"]
        images = [p["processed"] for p in media if p["type"] == "image"]
        features = self.features(recordings) if recordings else []
        audio_id, image_id = self.config.audio_token_id, self.config.image_token_id
        for token, count, what in ((audio_id, len(recordings), "recordings"), (image_id, len(images), "images")):
            if ids.count(token) != count:
                raise PromptError("messages", f"the chat template wrote {ids.count(token)} placeholders for "
                                              f"{count} {what}")
        if media:
            audio_counts = iter(self.config.audio.output_length(int(f.shape[-1])) for f in features)
            merge = self.config.vision.spatial_merge_size if images else 1
            image_counts = iter(image.tokens(merge) for image in images)
            expanded: list[int] = []
            for token in ids:
                if token == audio_id:
                    expanded += [audio_id] * next(audio_counts)
                elif token == image_id:
                    expanded += [image_id] * next(image_counts)
                else:
                    expanded.append(token)
            ids = expanded
        assistant_start(ids, self.config)  # the talker needs the assistant header
        return ThinkerPrompt(ids, features, images)

    def build(self, messages: Sequence[Mapping[str, Any]] | None = None, prompt: str | None = None,
              system: str | None = None) -> list[int]:
        """Thinker prompt ids of a text-only chat, ending with the assistant header
        ``<|im_start|>assistant\\n``."""
        built = self.build_prompt(messages, prompt, system)
        if built.multimodal:
            raise PromptError("messages", "holds media: use build_prompt")
        return built.ids


def _check_text(text: str, where: str, config: Qwen3OmniConfig) -> None:
    """Client text may not spell a media placeholder: it would be read as one (and the reference
    processor would expand it)."""
    for token in MEDIA_PLACEHOLDERS:
        if token in text:
            raise PromptError(where, f"must not contain the placeholder {token} (send media as content parts)")


# --------------------------------------------------------------------------- talker input


def user_positions(ids: Sequence[int], config: Qwen3OmniConfig) -> list[int]:
    """Prompt positions inside user turns: from a ``<|im_start|>`` whose next token is ``user`` up
    to the next ``<|im_start|>`` (the reference's mask; positions before any ``<|im_start|>``
    count as the turn that starts at position 0)."""
    last, out = 0, []
    for position, token in enumerate(ids):
        if token == config.im_start_token_id:
            last = position
        role = ids[min(last + 1, len(ids) - 1)]
        if role == config.user_token_id:
            out.append(position)
    return out


def assistant_start(ids: Sequence[int], config: Qwen3OmniConfig) -> int:
    """Position of the last ``<|im_start|>assistant`` of the prompt."""
    for position in range(len(ids) - 2, -1, -1):
        if ids[position] == config.im_start_token_id and ids[position + 1] == config.assistant_token_id:
            return position
    raise PromptError("messages", "the prompt has no <|im_start|>assistant header (chat template?)")


@dataclass
class _Special:
    bos: torch.Tensor  # [1, 1, hidden] each
    eos: torch.Tensor
    pad: torch.Tensor


class TalkerInput:
    """The talker's prefill and trailing text of one request, built from the thinker's tokens as
    they arrive (see the module docstring)."""

    def __init__(self, config: Qwen3OmniConfig, thinker, talker, prompt_ids: Sequence[int], speaker: str,
                 prompt_hidden: torch.Tensor | None = None, start_rows: int = COMMON_SHAPE_ROWS,
                 image_grids: Sequence[Sequence[int]] = ()) -> None:
        """``thinker``: anything with the thinker's ``embed(ids)`` (a :class:`~.thinker.Thinker`, or
        a holder of its ``embed_tokens`` table only: the talker reads token embeddings, not hidden
        states, for text); ``talker``: a :class:`~.talker.Talker`; ``prompt_hidden``: the thinker's
        hidden state ``accept_hidden_layer`` over the prompt ``[1, L, thinker_hidden]``, or its rows
        at the multimodal placeholders only ``[placeholders, thinker_hidden]`` (what the thinker
        stage sends), needed only when the prompt has multimodal placeholders; ``image_grids``:
        ``(t, h, w)`` of the prompt's images in order (the talker's rotary positions follow them)."""
        self.config = config
        self.thinker = thinker
        self.talker = talker
        speaker_id = config.talker.speaker_id.get(str(speaker).lower())
        if speaker_id is None:
            raise PromptError("speaker", f"unknown speaker {speaker!r}; known: {', '.join(config.talker.speakers)}")
        self.speaker_id = speaker_id
        self.start_rows = max(ASSISTANT_PREFIX_ROWS, int(start_rows))
        device = talker.codec_head.weight.device
        self.device = device
        prompt = torch.tensor([list(prompt_ids)], dtype=torch.long, device=device)
        self.prompt_length = prompt.shape[1]
        self.image_grids = [tuple(int(x) for x in grid) for grid in image_grids]
        self.user_ids = [int(prompt_ids[i]) for i in user_positions(list(prompt_ids), config)]
        self.user = self._user_part(prompt, prompt_hidden)
        special = torch.tensor([[config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id]],
                               dtype=torch.long, device=device)
        # one projection of the three special embeddings, as the reference computes them (M = 3)
        bos, eos, pad = talker.text_projection(thinker.embed(special)).chunk(3, dim=1)
        self.special = _Special(bos, eos, pad)
        start = assistant_start(prompt_ids, config)
        self._pending: list[int] = list(prompt_ids[start:])  # assistant tokens not projected yet
        self._rows: list[torch.Tensor] = []  # projected assistant rows, [1, hidden] each
        self.finished = False
        self.generated = 0
        self.trailing = TrailingText(pad.new_zeros(0, pad.shape[-1]), pad[0], closed=False, tts_eos=eos[0])

    # -- prompt part
    def _user_part(self, prompt: torch.Tensor, prompt_hidden: torch.Tensor | None) -> torch.Tensor:
        config, talker = self.config, self.talker
        ids = prompt[0].tolist()
        multimodal = torch.tensor([t in config.multimodal_token_ids for t in ids], device=prompt.device)
        embeds = self.thinker.embed(prompt)
        part = torch.empty(1, len(ids), config.talker.text.hidden_size, dtype=embeds.dtype, device=prompt.device)
        if bool(multimodal.any()):
            if prompt_hidden is None:
                raise PromptError("messages", "multimodal placeholders need the thinker's hidden states")
            rows = prompt_hidden[0, multimodal] if prompt_hidden.dim() == 3 else prompt_hidden
            if rows.shape[0] != int(multimodal.sum()):
                raise ValueError(f"{rows.shape[0]} hidden rows for {int(multimodal.sum())} multimodal placeholders")
            weight = talker.hidden_projection.linear_fc1.weight
            part[0, multimodal] = talker.hidden_projection(rows.to(weight.device, weight.dtype))
        # all text positions of the prompt in one matmul (the reference's shape), user rows kept
        part[0, ~multimodal] = talker.text_projection(embeds[0, ~multimodal])
        keep = torch.tensor(user_positions(ids, config), dtype=torch.long, device=prompt.device)
        return part[:, keep]

    # -- the thinker's answer as it arrives
    def add(self, ids: Sequence[int], last: bool = False) -> None:
        """The thinker's next generated tokens, in order. ``last``: ``ids[-1]`` is its final token
        (eos, or the one at the length limit), which the talker never reads."""
        if self.finished:
            raise ValueError("the thinker's answer has already ended")
        ids = list(ids)
        if last and not ids:
            raise ValueError("the call that ends the answer must carry its last token")
        self.generated += len(ids)
        self._pending += ids[:-1] if last else ids
        self.finished = last
        known = len(self._rows) + len(self._pending)
        if last or known >= self.start_rows:
            self._project(exact=last and not self._rows)
        if last:
            self.trailing.close()

    def _project(self, exact: bool) -> None:
        if not self._pending:
            return
        ids = torch.tensor([self._pending], dtype=torch.long, device=self.device)
        embeds = self.thinker.embed(ids)
        count = embeds.shape[1]
        if not exact:
            # zero rows pad the matmul to a common shape, whose row bits are those of a long segment
            target = common_shape_rows(count)
            embeds = torch.cat((embeds, embeds.new_zeros(1, target - count, embeds.shape[-1])), dim=1)
        rows = self.talker.text_projection(embeds)[0, :count]
        self._pending = []
        before = len(self._rows)
        self._rows += list(rows.split(1, dim=0))
        if len(self._rows) > ASSISTANT_PREFIX_ROWS:
            self.trailing.extend(torch.cat(self._rows[max(before, ASSISTANT_PREFIX_ROWS):], dim=0))

    def positions(self, prefill_length: int) -> tuple[torch.Tensor | None, int]:
        """The talker's rotary positions for a prefill of ``prefill_length`` rows ``[3, 1, L]`` and
        its decode ``delta``; ``(None, 0)`` (plain positions) for a prompt without images. The
        reference computes them over the talker's input ids: the user tokens, then ``tts_pad`` for
        the assistant rows."""
        if not self.image_grids:
            return None, 0
        from .media_positions import rope_positions, talker_media_tokens

        tokens = talker_media_tokens(self.config)
        ids = self.user_ids + [self.config.tts_pad_token_id] * (prefill_length - len(self.user_ids))
        audio_counts, run = [], 0
        for token in ids + [-1]:
            if token == tokens.audio_token_id:
                run += 1
            elif run:
                audio_counts.append(run)
                run = 0
        positions, delta = rope_positions(ids, tokens, self.image_grids, audio_counts)
        return positions.unsqueeze(1).to(self.device), delta

    @property
    def ready(self) -> bool:
        """Whether the prefill can be built (the prefix rows are projected)."""
        return len(self._rows) >= ASSISTANT_PREFIX_ROWS or self.finished

    def prefill(self) -> torch.Tensor:
        """The talker's prefill embeddings ``[1, user + 9, hidden]``."""
        if not self.ready:
            raise RuntimeError("the talker prefill needs more of the thinker's answer")
        c = self.config.talker
        rows = self._rows[:ASSISTANT_PREFIX_ROWS]
        head = torch.cat(rows[:3], dim=0).unsqueeze(0)
        first = torch.cat(rows[3:4], dim=0).unsqueeze(0) if len(rows) > 3 else head[:, :0]
        s = self.special
        text = torch.cat((head, s.pad.expand(1, 4, -1), s.bos, first), dim=1)
        codec_ids = torch.tensor([[c.codec_nothink_id, c.codec_think_bos_id, c.codec_think_eos_id, self.speaker_id,
                                   c.codec_pad_id, c.codec_bos_id]], dtype=torch.long, device=self.device)
        codec = torch.cat((text.new_zeros(1, 3, text.shape[-1]), self.talker.embed_codec(codec_ids)), dim=1)
        # a short answer has no first token: the reference's sum then covers 7 positions
        return torch.cat((self.user, text + codec[:, :text.shape[1]]), dim=1)
