"""The hibari voice's chunks: the wheel's own on ordinary text (so its audio, sample for sample),
and bounded in size and G2P time on any input of the API's 4,096 characters."""
from __future__ import annotations

import time

import numpy as np
import pytest

from omni_backend.errors import InvalidRequest
from omni_backend.models.hibari.text_chunks import (
    MAX_PHONEMES,
    MAX_RUN,
    phoneme_chunks,
    readable_text,
)

ORDINARY = [
    "Hello there.",
    "Hello! This server speaks. Does it? Yes… it does.",
    "Dr. Smith met J. K. Rowling on the 3rd of March 2024 at 7:30 pm; 1,250 people paid $9.99 each.",
    "“Quoted,” she said — and then: ‘single quotes’ (in brackets) [and these].\n\nA new paragraph.",
    # over MAX_PHONEMES, cut by the wheel at clause punctuation
    ", ".join(["the quick brown fox jumps over the lazy dog near the river"] * 9) + ".",
    "Pi is 3.14159265358979323846264338327950288419716939937510, the national debt $34,000,000,000,000.",
    "A URL: https://example.com/docs/a-page?q=1 and an e-mail, someone@example.org.",
    "Mixed CASE, CamelCaseWords, snake_case_names, 42nd, 1990s, 50%, £3.50, -17 degrees.",
]


@pytest.fixture(scope="module")
def tts():
    from hibari import Hibari

    return Hibari()


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_gives_the_wheels_chunks(tts, text):
    assert list(phoneme_chunks(tts, text)) == tts.phonemize(text)


def test_ordinary_text_gives_the_wheels_audio(tts):
    from omni_backend.models.hibari import HibariVoice

    voice = HibariVoice(max_concurrent=1)
    try:
        text = " ".join(ORDINARY[:3]) + " " + ORDINARY[4]
        ours = voice.synthesize(text, speed=1.1, seed=7)
        theirs = tts(text, speed=1.1, seed=7)
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)
    finally:
        voice.close()


ABUSIVE = {
    "numbers without punctuation": "123 " * 1024,            # was one 17-minute chunk (17 GB)
    "hyphen-joined words": "hello-" * 682,                   # was cubic G2P: 9 minutes
    "slash-joined path": "https://example.com/" + "path/" * 815,
    "CamelCase run": "HelloWorld" * 409,
    "initials": "A.B.C.D." * 512,
    "a 4,000-digit number": "1234567890" * 409,              # was IndexError past decillions
    "a comma-grouped huge number": ",".join(["123"] * 1024),
    "a huge currency amount": "$" + "9" * 4095,
    "one long letter run": "a" * 4096,
}


@pytest.mark.parametrize("name", sorted(ABUSIVE))
def test_any_input_is_read_in_bounded_chunks_and_time(tts, name):
    text = ABUSIVE[name][:4096]
    started = time.monotonic()
    chunks = list(phoneme_chunks(tts, text))
    elapsed = time.monotonic() - started
    assert chunks, name
    assert max(len(c) for c in chunks) <= MAX_PHONEMES, name
    assert elapsed < 10, f"{name}: G2P took {elapsed:.1f} s"
    # cut, never dropped: the chunks hold every phoneme of the text the voice reads
    whole = "".join(tts.g2p(s) for s in tts.split_sentences(readable_text(text)))
    assert "".join(chunks).replace(" ", "") == whole.replace(" ", ""), name


def test_sentences_are_read_one_at_a_time(tts):
    calls = []

    class Counting:
        split_sentences = staticmethod(tts.split_sentences)

        def g2p(self, sentence):
            calls.append(sentence)
            return tts.g2p(sentence)

    chunks = phoneme_chunks(Counting(), "First sentence. Second one. Third one.")
    next(chunks)
    assert calls == ["First sentence."]


def test_readable_text():
    big = "9" * 37
    assert readable_text(f"It costs ${big}.") == "It costs $" + " ".join(big) + "."
    assert readable_text("9" * 36) == "9" * 36                       # the wheel reads it
    assert readable_text("0" * 10 + "9" * 36) == "0" * 10 + "9" * 36  # leading zeros: value fits
    decimals = "3." + "1" * 50
    assert readable_text(decimals) == decimals                       # decimals are read digit by digit anyway
    run = readable_text("hello-" * 20)
    assert run.split(" ")[0] == "hello-" and max(len(p) for p in run.split()) <= MAX_RUN
    assert max(len(p) for p in readable_text("x" * 300).split()) == MAX_RUN
    short = "a-b-c https://example.com/a"
    assert readable_text(short) == short


def test_a_normalisation_failure_is_a_request_error_naming_the_field(tts):
    class Failing:
        split_sentences = staticmethod(tts.split_sentences)

        def g2p(self, sentence):
            raise IndexError("list index out of range")

    with pytest.raises(InvalidRequest) as caught:
        list(phoneme_chunks(Failing(), "Anything at all."))
    assert caught.value.field == "text" and "Anything at all." in str(caught.value)
