"""16-bit PCM WAV files."""
from __future__ import annotations

import io
import wave

import numpy as np


def pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def wav_bytes(audio: np.ndarray, sample_rate: int) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm16(audio))
    return buf.getvalue()


def write_wav(path: str, audio: np.ndarray, sample_rate: int) -> None:
    with open(path, "wb") as f:
        f.write(wav_bytes(audio, sample_rate))


def read_wav(data: bytes) -> tuple[np.ndarray, int]:
    with wave.open(io.BytesIO(data), "rb") as w:
        frames = w.readframes(w.getnframes())
        return np.frombuffer(frames, "<i2").astype(np.float32) / 32767.0, w.getframerate()
