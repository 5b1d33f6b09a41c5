"""Helpers of the speech API system tests: texts, audio decoding, Triton metrics, SSE parsing."""
from __future__ import annotations

import io
import json
import re
import shutil
import time
import urllib.request
from pathlib import Path

import av
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
TEXT = "Hello there. This is a streaming test of the speech API. It has three sentences."
# About twenty seconds of speech over many sentences: long enough to see streaming happen.
MEDIUM_TEXT = " ".join(f"Sentence number {i} is spoken while the next one is still being made." for i in range(12))
# A few minutes of audio at half speed: a stream that is still running when a test interrupts it.
LONG_TEXT = " ".join(f"The quick brown fox number {i} jumps over the lazy dog near the river bank."
                     for i in range(55))[:4000]


# ---------------------------------------------------------------- audio

def decode(data: bytes, response_format: str) -> tuple[np.ndarray, int]:
    """Float mono samples and the decoded sample rate of a whole response body."""
    if response_format == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32768.0, 24000
    scale = {"s16": 32768.0, "s16p": 32768.0, "s32": 2147483648.0, "s32p": 2147483648.0}
    parts = []
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        for frame in container.decode(stream):
            parts.append(frame.to_ndarray().astype(np.float32).reshape(-1) / scale.get(frame.format.name, 1.0))
        rate = stream.codec_context.sample_rate
    return (np.concatenate(parts) if parts else np.zeros(0, np.float32)), rate


def rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(samples, dtype=np.float64)))) if samples.size else 0.0


def sse_events(text: str) -> list[dict]:
    events = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: "):]))
    return events


# ---------------------------------------------------------------- Triton metrics

def metric(triton, name: str, **labels) -> float:
    """A metric's value on Triton's /metrics (0 when it has not appeared yet)."""
    with urllib.request.urlopen(triton.metrics_url, timeout=5) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_for(predicate, timeout_s: float, interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval_s)


# ---------------------------------------------------------------- model repositories

def hibari_repository(target: Path) -> Path:
    """A copy of the committed repository's hibari models only (quick to load)."""
    for model in ("hibari", "hibari__synthesizer"):
        shutil.copytree(ROOT / "model_repository" / model, target / model,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return target
