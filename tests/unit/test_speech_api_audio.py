"""Streaming encoders, the time-stretch and the resampler, without any server."""
from __future__ import annotations

import io
import struct

import av
import numpy as np
import pytest

from client.speech_api.encoders import CONTENT_TYPES, make_encoder
from client.speech_api.resample import Resampler
from client.speech_api.speed import TimeStretch, plan_speed


def tone(rate: int, seconds: float, hz: float = 220.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.4 * np.sin(2 * np.pi * hz * t) * (1 + 0.2 * np.sin(2 * np.pi * 2 * t))).astype(np.float32)


def peak_hz(x: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(x.size)))
    return float(np.argmax(spectrum) * rate / x.size)


def decode(data: bytes, fmt: str) -> tuple[np.ndarray, int]:
    if fmt == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32768, 24000
    with av.open(io.BytesIO(data)) as c:
        frames = [f.to_ndarray().reshape(-1).astype(np.float32) for f in c.decode(audio=0)]
        rate = c.streams.audio[0].codec_context.sample_rate
    x = np.concatenate(frames)
    return (x / 32768 if np.abs(x).max() > 2 else x), rate


@pytest.mark.parametrize("rate", [24000, 22050, 16000])
@pytest.mark.parametrize("fmt", list(CONTENT_TYPES))
def test_encoders_stream_and_decode_back(fmt, rate):
    audio = tone(rate, 2.0)
    encoder = make_encoder(fmt, rate)
    parts = [encoder.encode(c) for c in np.array_split(audio, 5)]
    parts.append(encoder.finish())
    assert parts[0], "bytes leave with the first chunk"
    assert sum(bool(p) for p in parts) >= 4, "and with the ones after it"
    samples, decoded_rate = decode(b"".join(parts), fmt)
    if fmt == "pcm":
        assert decoded_rate == 24000
    duration = samples.size / decoded_rate
    assert abs(duration - 2.0) < 0.15, duration  # lossy codecs add priming and padding
    assert abs(peak_hz(samples, decoded_rate) - 220) < 3


@pytest.mark.parametrize("fmt", list(CONTENT_TYPES))
def test_an_encoder_given_no_audio_finishes(fmt):
    """A request may end before its first frame (max_new_tokens 1): the encoder still finishes
    (lameenc raised from its flush, which cut the HTTP body)."""
    data = make_encoder(fmt, 24000).finish()
    assert isinstance(data, bytes)
    if fmt == "wav":
        assert data[:4] == b"RIFF" and struct.unpack("<I", data[24:28])[0] == 24000


def test_wav_header_claims_no_length():
    data = make_encoder("wav", 24000).encode(tone(24000, 0.1))
    assert data[:4] == b"RIFF" and struct.unpack("<I", data[4:8])[0] == 0xFFFFFFFF
    assert data[36:40] == b"data" and struct.unpack("<I", data[40:44])[0] == 0xFFFFFFFF
    assert struct.unpack("<I", data[24:28])[0] == 24000


def test_mp3_has_no_xing_or_info_frame():
    encoder = make_encoder("mp3", 24000)
    data = encoder.encode(tone(24000, 1.0)) + encoder.finish()
    assert b"Xing" not in data and b"Info" not in data
    assert data[0] == 0xFF and data[1] & 0xE0 == 0xE0


def test_pcm_is_always_24khz():
    encoder = make_encoder("pcm", 16000)
    data = b"".join(encoder.encode(c) for c in np.array_split(tone(16000, 1.0), 7)) + encoder.finish()
    samples = np.frombuffer(data, "<i2")
    assert abs(samples.size - 24000) <= 2
    assert abs(peak_hz(samples.astype(np.float32), 24000) - 220) < 3


def test_resampler_is_seamless_across_chunks():
    x = tone(22050, 1.0)
    whole = Resampler(22050, 24000)
    a = np.concatenate([whole.push(x), whole.flush()])
    pieces = Resampler(22050, 24000)
    b = np.concatenate([pieces.push(c) for c in np.array_split(x, 13)] + [pieces.flush()])
    assert abs(a.size - 24000) <= 2 and a.size == b.size
    np.testing.assert_allclose(a, b, atol=1e-4)


def test_speed_plan_without_native_control():
    plan = plan_speed(0.25, None)
    assert (plan.native, plan.stretch) == (1.0, 0.25)


@pytest.mark.parametrize("tempo", [0.25, 0.5, 0.8, 1.5, 2.0, 4.0])
def test_time_stretch_changes_duration_not_pitch(tempo):
    rate = 24000
    x = tone(rate, 2.0)
    stretch = TimeStretch(tempo, rate)
    y = np.concatenate([stretch.push(c) for c in np.array_split(x, 9)] + [stretch.flush()])
    assert y.size == round(x.size / tempo)
    assert abs(peak_hz(y, rate) - 220) < 2
    # no clicks: this tone (peak 0.48 at 220 Hz) moves at most 2*pi*220/24000*0.48 = 0.028 per sample
    assert np.abs(np.diff(y[200:-200])).max() < 0.035
    assert np.abs(y).max() < 0.55


def test_time_stretch_does_not_depend_on_chunking():
    x = tone(24000, 1.5, hz=180)
    one = TimeStretch(1.7, 24000)
    a = np.concatenate([one.push(x), one.flush()])
    many = TimeStretch(1.7, 24000)
    b = np.concatenate([many.push(c) for c in np.array_split(x, 31)] + [many.flush()])
    np.testing.assert_array_equal(a, b)


def test_time_stretch_latency_is_small():
    stretch = TimeStretch(2.0, 24000)
    out = stretch.push(tone(24000, 0.5))
    # all but ~one frame plus the search tolerance of what is there is final at once
    assert out.size >= (12000 - 2400) / 2
