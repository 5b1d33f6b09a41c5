"""Orpheus's token rules: the prompt, the stop ids, and the token -> SNAC code mapping.

Orpheus is a Llama whose vocabulary extends Llama 3's with ``<custom_token_N>`` tokens. Audio is
SNAC 24 kHz codes written 7 tokens per frame; the token of frame position ``p`` (0..6) carries
code ``N - 10 - p * 4096``. The rules follow the released ``orpheus-speech`` 0.1.0 package:

* Prompt (``OrpheusModel._format_prompt``, larger models): ``<custom_token_3>`` (start of human),
  the tokenized ``"{voice}: {text}"`` (with its ``<|begin_of_text|>``), ``<|eot_id|>`` and
  ``<custom_token_4> <custom_token_5> <custom_token_1>`` (end of human, start of AI, start of
  speech). The package decodes those ids to a string and vLLM tokenizes that string again (adding
  ``<|begin_of_text|>``): :meth:`OrpheusPrompt.ids` does the same round trip, so the ids are the
  ones the released server feeds its model.
* Codes (``tokens_decoder``): a token that is no custom token is skipped; the code of a custom
  token uses the count of codes accepted so far as its frame position; a code <= 0 is skipped
  (it does not advance the count).
* Audio (``convert_to_audio``): after every 7th code, from the 28th on, the last 28 codes (4
  frames) are decoded and the second frame's audio is kept; a window with a code above 4096
  gives no audio (the package returns nothing for it). The package lets code 4096 through and
  then fails on it (the codebook has 4096 entries); here such a window gives no audio either.

The package also passes ``stop_token_ids=[49158]``, an id that is no special token of the
released vocabulary; generation ends on the checkpoint's eos ids and ``<custom_token_2>`` (end of
speech) here.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Iterable

import numpy as np

__all__ = ["OrpheusTokens", "OrpheusPrompt", "CodeAssembler", "FRAME_TOKENS", "WINDOW_FRAMES", "CODEBOOK_SIZE",
           "VOICES", "WindowCutter", "window_codebooks", "window_is_valid", "clean_up_tokenization",
           "voice_names"]

FRAME_TOKENS = 7           # SNAC codes per frame: 1 + 2 + 4 over the three codebooks
WINDOW_FRAMES = 4          # frames decoded per audio window; the second one's audio is kept
CODEBOOK_SIZE = 4096
CODE_OFFSET = 10           # custom tokens 0..9 are control tokens
# The voices of the released English finetuned model (its prompt prefix "voice: "). Other
# finetunes (the released multilingual ones, a user's own) name theirs in the deploy YAML.
VOICES = ("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe")
MAX_VOICE_CHARS = 64

_CUSTOM = re.compile(r"<custom_token_(\d+)>")
# A voice is written into the prompt as "{voice}: {text}": no separator, control character or
# special-token brackets inside a name.
_VOICE_NAME = re.compile(r"[^\s,:<>\[\]\x00-\x1f\x7f]+(?: [^\s,:<>\[\]\x00-\x1f\x7f]+)*")


def voice_names(listed: str) -> tuple[str, ...]:
    """The voices a deploy lists (``"pierre, amelie"``), in order; the first is the default and
    an empty list means the checkpoint takes no voice (the pretrained one: the prompt is the text
    alone). Names keep their case and match requests case-insensitively. ValueError names the
    problem."""
    names = tuple(n.strip() for n in listed.split(",")) if listed.strip() else ()
    seen: set[str] = set()
    for n in names:
        if not n:
            raise ValueError(f"an empty name in {listed!r} (names are separated by commas)")
        if len(n) > MAX_VOICE_CHARS or not _VOICE_NAME.fullmatch(n):
            raise ValueError(f"{n[:MAX_VOICE_CHARS]!r} is not a voice name (at most {MAX_VOICE_CHARS} "
                             "characters; no ':', '<', '>', '[', ']' or control characters)")
        if n.lower() in seen:
            raise ValueError(f"{n!r} is listed twice")
        seen.add(n.lower())
    return names


@dataclass(frozen=True)
class OrpheusTokens:
    """The ids the rules need, read from the checkpoint's tokenizer by their strings."""

    bos: int                 # <|begin_of_text|>
    end_of_text: int         # <|eot_id|>
    custom_base: int         # id of <custom_token_0>
    vocab_size: int

    def custom(self, n: int) -> int:
        return self.custom_base + n

    @property
    def start_of_human(self) -> int:
        return self.custom(3)

    @property
    def end_of_human(self) -> int:
        return self.custom(4)

    @property
    def start_of_ai(self) -> int:
        return self.custom(5)

    @property
    def start_of_speech(self) -> int:
        return self.custom(1)

    @property
    def end_of_speech(self) -> int:
        return self.custom(2)

    def code(self, token: int, position: int) -> int | None:
        """The SNAC code a token carries at frame position ``position`` (None: not a custom token)."""
        if token < self.custom_base:
            return None
        return token - self.custom_base - CODE_OFFSET - (position % FRAME_TOKENS) * CODEBOOK_SIZE

    def code_token_range(self, position: int) -> tuple[int, int]:
        """Token ids whose code at ``position`` is a valid code 1..4095 (half-open)."""
        first = self.custom_base + CODE_OFFSET + position * CODEBOOK_SIZE
        return first + 1, first + CODEBOOK_SIZE


class OrpheusPrompt:
    """Prompt ids of one request, from the checkpoint's ``tokenizer.json`` (``tokenizers``)."""

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer

        file = os.path.join(path, "tokenizer.json")
        if not os.path.exists(file):
            raise ValueError(f"{path}: no tokenizer.json (Orpheus checkpoints ship the Llama 3 tokenizer)")
        self.tokenizer = Tokenizer.from_file(file)
        config_file = os.path.join(path, "tokenizer_config.json")
        config = {}
        if os.path.exists(config_file):
            with open(config_file, encoding="utf-8") as f:
                config = json.load(f)
        # transformers' decode() cleans " ," / " n't" ... when the checkpoint asks (Llama 3 does);
        # the released prompt goes through that decode, so the same cleanup applies here.
        self.clean_up_spaces = bool(config.get("clean_up_tokenization_spaces", False))
        self.tokens = OrpheusTokens(bos=self._id("<|begin_of_text|>"), end_of_text=self._id("<|eot_id|>"),
                                    custom_base=self._id("<custom_token_0>"),
                                    vocab_size=self.tokenizer.get_vocab_size(with_added_tokens=True))

    def _id(self, token: str) -> int:
        i = self.tokenizer.token_to_id(token)
        if i is None:
            raise ValueError(f"the tokenizer has no {token!r}: not an Orpheus (Llama 3 + custom tokens) tokenizer")
        return i

    def ids(self, text: str, voice: str | None) -> list[int]:
        t = self.tokens
        body = self.tokenizer.encode(f"{voice}: {text}" if voice else text, add_special_tokens=True).ids
        ids = [t.start_of_human, *body, t.end_of_text, t.end_of_human, t.start_of_ai, t.start_of_speech]
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        if self.clean_up_spaces:
            text = clean_up_tokenization(text)
        return self.tokenizer.encode(text, add_special_tokens=True).ids


def clean_up_tokenization(text: str) -> str:
    """transformers' ``clean_up_tokenization`` (the replacements, in its order)."""
    return (text.replace(" .", ".").replace(" ?", "?").replace(" !", "!").replace(" ,", ",")
            .replace(" ' ", "'").replace(" n't", "n't").replace(" 'm", "'m").replace(" 's", "'s")
            .replace(" 've", "'ve").replace(" 're", "'re"))


class CodeAssembler:
    """One request's token stream -> accepted SNAC codes, and the windows they make."""

    def __init__(self, tokens: OrpheusTokens) -> None:
        self.tokens = tokens
        self.codes: list[int] = []

    def feed(self, token_ids: Iterable[int]) -> list[int]:
        """The codes these tokens add (in order)."""
        new = []
        for token in token_ids:
            code = self.tokens.code(int(token), len(self.codes))
            if code is not None and code > 0:
                self.codes.append(code)
                new.append(code)
        return new


class WindowCutter:
    """Accepted codes -> the windows the package decodes: after every 7th code, from the 28th on,
    the last 28 codes, with the window's index (0 for the first); windows holding a code outside
    the codebook are skipped (no audio), their index counts all the same."""

    def __init__(self) -> None:
        self.codes: list[int] = []

    def add(self, codes: Iterable[int]) -> list[tuple[int, list[int]]]:
        out = []
        size = FRAME_TOKENS * WINDOW_FRAMES
        for code in codes:
            self.codes.append(int(code))
            n = len(self.codes)
            if n % FRAME_TOKENS or n < size:
                continue
            window = self.codes[-size:]
            if window_is_valid(window):
                out.append((n // FRAME_TOKENS - WINDOW_FRAMES, window))
        return out


def window_codebooks(windows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Windows of codes ``[N, frames * 7]`` -> SNAC's three codebooks ``[N, frames]``,
    ``[N, 2 * frames]``, ``[N, 4 * frames]``: frame position 0 is codebook 0; 1 and 4 codebook 1;
    2, 3, 5, 6 codebook 2, each in frame order (``convert_to_audio``)."""
    n = windows.shape[0]
    frames = windows.reshape(n, -1, FRAME_TOKENS)
    return frames[:, :, 0], frames[:, :, [1, 4]].reshape(n, -1), frames[:, :, [2, 3, 5, 6]].reshape(n, -1)


def window_is_valid(window: list[int]) -> bool:
    """Whether the package decodes this window (all codes within the codebook)."""
    return all(0 <= c < CODEBOOK_SIZE for c in window)
