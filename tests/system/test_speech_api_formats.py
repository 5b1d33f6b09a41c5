"""Every response format and SSE through the official openai SDK, decoded and checked against
the audio Triton produces for the same request."""
from __future__ import annotations

import base64
import shutil
import struct
import subprocess
import time

import numpy as np
import pytest

from client.triton_stream import synthesize
from tests.requirement import require
from tests.system.speech_api_helpers import MEDIUM_TEXT, TEXT, decode, rms, sse_events

# The shared fixtures (one shim process for the whole session) live in a plugin module.
pytest_plugins = ["tests.system.speech_api_fixtures"]
pytestmark = pytest.mark.system

CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
                 "wav": "audio/wav", "pcm": "audio/pcm"}
# What a decoder gives back: libopus always decodes at 48 kHz; the others keep the model's 24 kHz.
DECODED_RATE = {"opus": 48000}
LOSSLESS = ("wav", "pcm", "flac")
# Lossy codecs add encoder delay/padding (mp3 ~1 frame, aac 1024 samples, opus pre-skip).
DURATION_TOLERANCE_S = 0.15


@pytest.fixture(scope="module")
def reference(triton):
    """The same request straight from Triton: what every format must carry."""
    return synthesize(triton.grpc_url, "hibari", TEXT)


def quantized(audio: np.ndarray) -> np.ndarray:
    return np.round(np.clip(audio, -1, 1) * 32767.0) / 32768.0


def check_container(fmt: str, data: bytes) -> None:
    if fmt == "wav":
        assert data[:4] == b"RIFF" and data[8:12] == b"WAVE"
        riff_size = struct.unpack("<I", data[4:8])[0]
        data_size = struct.unpack("<I", data[40:44])[0]
        assert data[36:40] == b"data"
        assert riff_size == data_size == 0xFFFFFFFF, "a streamed WAV must not claim a length"
    elif fmt == "mp3":
        assert data[0] == 0xFF and data[1] & 0xE0 == 0xE0, "starts with an MPEG audio frame"
        assert b"Xing" not in data[:2048] and b"Info" not in data[:2048], "no Xing/Info length header"
    elif fmt == "opus":
        assert data[:4] == b"OggS"
        head = data.index(b"OpusHead")
        assert struct.unpack("<I", data[head + 12:head + 16])[0] == 24000, "OpusHead keeps the input rate"
    elif fmt == "aac":
        assert data[0] == 0xFF and data[1] & 0xF6 == 0xF0, "ADTS sync word"
    elif fmt == "flac":
        assert data[:4] == b"fLaC"


@pytest.mark.parametrize("fmt", list(CONTENT_TYPES))
def test_create_returns_decodable_audio_in_every_format(openai_client, reference, fmt):
    response = openai_client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format=fmt)
    assert response.response.headers["content-type"] == CONTENT_TYPES[fmt]
    data = response.content
    check_container(fmt, data)
    samples, rate = decode(data, fmt)
    assert rate == DECODED_RATE.get(fmt, 24000)
    duration = samples.size / rate
    assert abs(duration - reference.audio_s) < DURATION_TOLERANCE_S, (duration, reference.audio_s)
    assert rms(samples) > 0.01, "not silent"
    if fmt in LOSSLESS:
        np.testing.assert_allclose(samples, quantized(reference.audio), atol=2.0 / 32768)


@pytest.mark.parametrize("fmt", list(CONTENT_TYPES))
def test_streaming_response_delivers_bytes_before_synthesis_ends(openai_client, fmt):
    t0 = time.perf_counter()
    first = None
    chunks = []
    with openai_client.audio.speech.with_streaming_response.create(
            model="hibari", voice="heart", input=MEDIUM_TEXT, response_format=fmt) as response:
        assert response.headers["content-type"] == CONTENT_TYPES[fmt]
        assert response.headers.get("transfer-encoding") == "chunked"
        for chunk in response.iter_bytes():
            if first is None:
                first = time.perf_counter() - t0
            chunks.append(chunk)
    total = time.perf_counter() - t0
    assert len(chunks) > 1, "audio arrives in several pieces"
    assert first < 0.6 * total, f"first bytes at {first:.3f} s of {total:.3f} s: not streamed"
    samples, rate = decode(b"".join(chunks), fmt)
    assert samples.size / rate > 10.0
    assert rms(samples) > 0.01


@pytest.mark.parametrize("fmt", list(CONTENT_TYPES))
def test_curl_gets_every_format(shim, reference, fmt, tmp_path):
    curl = shutil.which("curl")
    require(curl is not None, "curl is not installed (apt-get install curl; `make debs` installs it)")
    body = f'{{"model":"tts-1","input":"{TEXT}","voice":"alloy","response_format":"{fmt}"}}'
    target = tmp_path / f"speech.{fmt}"
    out = subprocess.run([curl, "-sS", "-N", "--fail-with-body", "-D", "-", "-o", str(target),
                          "-H", "content-type: application/json", "-d", body, f"{shim.url}/v1/audio/speech"],
                         capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    headers = out.stdout.decode().lower()
    assert headers.startswith("http/1.1 200") and f"content-type: {CONTENT_TYPES[fmt]}" in headers
    assert "transfer-encoding: chunked" in headers
    samples, rate = decode(target.read_bytes(), fmt)
    assert abs(samples.size / rate - reference.audio_s) < DURATION_TOLERANCE_S
    assert rms(samples) > 0.01


def test_sse_deltas_carry_the_audio_then_done_with_usage(openai_client, reference):
    response = openai_client.audio.speech.create(model="gpt-4o-mini-tts", voice="alloy", input=TEXT,
                                                 response_format="pcm", stream_format="sse")
    assert response.response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.content.decode())
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert deltas and events[-1]["type"] == "speech.audio.done"
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    usage = events[-1]["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    pcm = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    samples, _ = decode(pcm, "pcm")
    np.testing.assert_allclose(samples, quantized(reference.audio), atol=2.0 / 32768)


def test_sse_streams_line_by_line_in_a_compressed_format(openai_client):
    t0 = time.perf_counter()
    first = None
    lines = []
    with openai_client.audio.speech.with_streaming_response.create(
            model="hibari", voice="heart", input=MEDIUM_TEXT, response_format="mp3",
            stream_format="sse") as response:
        for line in response.iter_lines():
            if first is None and line:
                first = time.perf_counter() - t0
            lines.append(line)
    total = time.perf_counter() - t0
    events = sse_events("\n".join(lines))
    assert events[-1]["type"] == "speech.audio.done"
    mp3 = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    samples, rate = decode(mp3, "mp3")
    assert samples.size / rate > 10.0 and rms(samples) > 0.01
    assert first < 0.6 * total


def _duration(client, speed: float) -> tuple[float, np.ndarray]:
    response = client.audio.speech.create(model="hibari", voice="heart", input=TEXT, response_format="wav",
                                          speed=speed)
    samples, rate = decode(response.content, "wav")
    return samples.size / rate, samples


def _centroid_hz(samples: np.ndarray, rate: int = 24000) -> float:
    spectrum = np.abs(np.fft.rfft(samples))
    freqs = np.fft.rfftfreq(samples.size, 1.0 / rate)
    band = freqs < 4000
    return float((spectrum[band] * freqs[band]).sum() / spectrum[band].sum())


def test_speed_uses_the_models_control_then_time_stretches_keeping_pitch(openai_client):
    d = {s: _duration(openai_client, s) for s in (0.25, 0.5, 1.0, 2.0, 4.0)}
    # hibari's own control covers 0.5..2.0
    assert 0.35 < d[2.0][0] / d[1.0][0] < 0.7
    assert 1.5 < d[0.5][0] / d[1.0][0] < 2.6
    # beyond it the shim stretches the model's 2.0 / 0.5 output by exactly the rest
    assert abs(d[4.0][0] / d[2.0][0] - 0.5) < 0.01
    assert abs(d[0.25][0] / d[0.5][0] - 2.0) < 0.02
    # a time-stretch keeps the spectrum where it was (resampling would move it by 2x)
    assert 0.8 < _centroid_hz(d[4.0][1]) / _centroid_hz(d[2.0][1]) < 1.25
    assert 0.8 < _centroid_hz(d[0.25][1]) / _centroid_hz(d[0.5][1]) < 1.25
