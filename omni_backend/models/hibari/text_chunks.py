"""Text -> the phoneme chunks the voice synthesises one at a time, with every input's cost bounded.

The wheel (`Hibari.phonemize`) splits sentences, and sentences over `MAX_PHONEMES` at clause
punctuation. Three valid inputs of at most 4,096 characters broke it:
- a sentence without clause punctuation stays one chunk: "123 " x 800 is one 17-minute
  synthesis needing 17 GB, and its first audio waits for all of it;
- its G2P is cubic in a token joined by punctuation or case changes: "hello-" x 600 took 9 minutes;
- an integer of 10**36 or more (past "decillion") raises IndexError.

Here every whitespace-free run is cut to at most `MAX_RUN` characters, such integers are read digit
by digit, sentences are read one at a time (first audio never waits for the rest) and a chunk
still over `MAX_PHONEMES` is cut at word boundaries. Any other text gives the wheel's chunks,
so the audio is the wheel's, sample for sample (tests/unit/test_hibari_text_chunks.py).
"""
from __future__ import annotations

import re
from typing import Any, Iterator

from omni_backend.errors import InvalidRequest

MAX_PHONEMES = 400    # the wheel's chunk bound (hibari.tts.MAX_PHONEMES)
MAX_RUN = 64          # a run's G2P takes ~5 ms at 64 characters and ~3 s at 600
MAX_NUMBER_DIGITS = 36  # the wheel's number words end at decillions (10**33)

_CLAUSE = re.compile(r"(?<=[,;:—])\s+")    # the wheel's clause split of a long sentence's phonemes
# an integer part: digits with single commas between, not a number's decimals ("3.1415...")
_INTEGER = re.compile(r"(?<![\d,])(?<!\d\.)\d(?:,?\d)*")
_RUN = re.compile(rf"\S{{{MAX_RUN + 1},}}")
_AFTER_PUNCTUATION = re.compile(r"(?<=[^\w\s])(?=\w)")


def _digit_by_digit(match: re.Match) -> str:
    number = match.group()
    digits = number.replace(",", "")
    if len(digits.lstrip("0")) <= MAX_NUMBER_DIGITS:
        return number
    return " ".join(digits)


def _cut_run(match: re.Match) -> str:
    pieces = []
    for piece in _AFTER_PUNCTUATION.sub(" ", match.group()).split(" "):
        pieces += [piece[i:i + MAX_RUN] for i in range(0, len(piece), MAX_RUN)]
    return " ".join(pieces)


def readable_text(text: str) -> str:
    """The text with too-large integers spelled digit by digit and no run over `MAX_RUN` characters."""
    return _RUN.sub(_cut_run, _INTEGER.sub(_digit_by_digit, text))


def _joined(parts: list[str]) -> list[str]:
    """Consecutive parts joined by spaces while a join stays within `MAX_PHONEMES` (the wheel's
    rule; a longer part stays alone)."""
    chunks: list[str] = []
    current = ""
    for part in parts:
        if current and len(current) + len(part) + 1 > MAX_PHONEMES:
            chunks.append(current)
            current = part
        else:
            current = f"{current} {part}" if current else part
    if current:
        chunks.append(current)
    return chunks


def _within_bound(chunk: str) -> list[str]:
    """A chunk over `MAX_PHONEMES` cut at word boundaries (a longer word at `MAX_PHONEMES`)."""
    words = [word[i:i + MAX_PHONEMES] for word in chunk.split(" ") for i in range(0, len(word), MAX_PHONEMES)]
    return _joined(words)


def _sentence_chunks(phonemes: str) -> list[str]:
    """The wheel's chunks of one sentence's phonemes (cut at clause punctuation), then the bound on each."""
    if len(phonemes) <= MAX_PHONEMES:
        return [phonemes]
    return [piece for chunk in _joined(_CLAUSE.split(phonemes))
            for piece in (_within_bound(chunk) if len(chunk) > MAX_PHONEMES else [chunk])]


def phoneme_chunks(tts: Any, text: str) -> Iterator[str]:
    """Yield the phoneme chunks of `text` for `tts` (a `hibari.Hibari`), one sentence's G2P at a time."""
    for sentence in tts.split_sentences(readable_text(text)):
        try:
            phonemes = tts.g2p(sentence)
        except Exception as exc:   # the wheel's text normalisation on input it cannot read
            raise InvalidRequest("text", f"cannot be read aloud near {sentence[:40]!r} "
                                         f"({type(exc).__name__} in the voice's text normalisation)") from exc
        if phonemes:
            yield from _sentence_chunks(phonemes)
