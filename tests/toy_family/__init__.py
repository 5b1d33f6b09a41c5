"""A test-only model family declared entirely here: three stages that pass tensors.

It proves that the shared layers (entry, stages, transfers, builder, speech API catalog) serve a
family they have never heard of: `writer` streams the text's code points in pieces (INT64) and
each piece's text to the client (TEXT_DELTA, a client output), `shaper` turns each piece into
frames (FP32 [n, 2]) on a stream opened per piece, `render` (a batched stage) turns frames into
audio. The expected audio is `expected_audio` below;
`return_audio: false` skips shaper and render (text only).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

PIECE = 3   # code points per writer response


def text_pieces(text: str) -> list[str]:
    """The writer's TEXT_DELTA responses for `text`."""
    return [text[i:i + PIECE] for i in range(0, len(text), PIECE)]


def frames_of(tokens: np.ndarray) -> np.ndarray:
    t = tokens.astype(np.float32)
    return np.stack([np.sin(t / 7.0), np.cos(t / 11.0)], axis=1)


def audio_of(frames: np.ndarray, gain: float) -> np.ndarray:
    return (frames.reshape(-1) * np.float32(gain)).astype(np.float32)


def expected_audio(text: str, gain: float) -> np.ndarray:
    tokens = np.array([ord(c) for c in text], dtype=np.int64)
    return np.concatenate([audio_of(frames_of(tokens[i:i + PIECE]), gain)
                           for i in range(0, len(tokens), PIECE)])


PIPELINE = "toy_three_stage"


def build_repository(repo: Path) -> Path:
    """The toy pipeline built by the real builder into the model repository `repo`."""
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-m", "ensemble_builder", "build", "--family", "tests.toy_family.family",
                    "--pipeline", PIPELINE, "--deploy", str(root / "tests/toy_family/toy_three_stage.yaml"),
                    "--out", str(repo)], check=True, cwd=root, capture_output=True)
    return repo
