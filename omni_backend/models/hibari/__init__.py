"""The English voice that ships inside the hibari-tts wheel (24 kHz, one chunk per sentence)."""
from __future__ import annotations

from typing import Iterator

import numpy as np

SAMPLE_RATE = 24000


class HibariVoice:
    """Loads the bundled voice once; `stream()` yields one float32 array per sentence.

    Audio for a given (text, speed, seed) is identical whether streamed or synthesized at once:
    one noise generator runs across the sentences of a request.
    """

    def __init__(self, threads: int = 1):
        from hibari import Hibari
        from hibari.voices import VOICES

        if not VOICES["heart"].get("bundled"):
            raise RuntimeError("hibari-tts no longer bundles the 'heart' voice")
        self.tts = Hibari(voice="heart", threads=threads)
        self.tts("Warm up.", seed=0)  # loads the G2P and the ONNX session's kernels

    def stream(self, text: str, voice: str = "heart", speed: float = 1.0, seed: int = 0) -> Iterator[np.ndarray]:
        return self.tts.stream(text, speed=speed, seed=seed)

    def synthesize(self, text: str, speed: float = 1.0, seed: int = 0) -> np.ndarray:
        parts = list(self.stream(text, speed=speed, seed=seed))
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)
