"""Offline speech recognition for intelligibility checks (pocketsphinx's en-us model)."""
from __future__ import annotations

import re

import numpy as np
from scipy.signal import resample_poly


def transcribe(audio: np.ndarray, sample_rate: int) -> str:
    from pocketsphinx import Decoder

    x = resample_poly(audio.astype(np.float64), 16000, sample_rate)
    pcm = (np.clip(x, -1, 1) * 32767).astype(np.int16).tobytes()
    dec = Decoder(samprate=16000, loglevel="FATAL")
    dec.start_utt()
    dec.process_raw(pcm, full_utt=True)
    dec.end_utt()
    return dec.hyp().hypstr if dec.hyp() else ""


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z' ]", " ", text.lower()).split()


def word_error_rate(reference: str, hypothesis: str) -> float:
    r, h = words(reference), words(hypothesis)
    d = np.zeros((len(r) + 1, len(h) + 1), dtype=int)
    d[:, 0] = np.arange(len(r) + 1)
    d[0, :] = np.arange(len(h) + 1)
    for i in range(1, len(r) + 1):
        for j in range(1, len(h) + 1):
            d[i, j] = min(d[i - 1, j] + 1, d[i, j - 1] + 1, d[i - 1, j - 1] + (r[i - 1] != h[j - 1]))
    return d[-1, -1] / max(len(r), 1)
