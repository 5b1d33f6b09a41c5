"""Shared Qwen3-Omni fixtures: tiny random checkpoints of three shapes and one greedy run of the
reference (transformers' ``qwen3_omni_moe`` in ``.venv-omni-oracle``, by subprocess) per shape.

Session-scoped fixtures:

    qwen3_omni_checkpoints   {shape: Path} for "tiny", "tiny2", "tiny3" (rigs: QWEN3_OMNI_SHAPES)
    qwen3_omni_jobs          the parity jobs (QWEN3_OMNI_JOBS, the same for every shape)
    qwen3_omni_reference     {shape: {"checkpoint": Path, "out": Path, "meta": {...},
                              "jobs": {job id: {summary fields + arrays}}}}

A job's entry holds the oracle's summary (``job`` with defaults filled in, ``text``,
``prompt_text``, ``ended_with_im_end``, ``generated``, ``frames``, ``samples``,
``talker_ended_with_eos``) and its arrays (``input_ids``, ``sequences``, ``thinker_ids``, and with
audio ``codes`` [16, frames], ``talker_ids``, ``waveform``); see tests/oracle/qwen3_omni_reference.py.

tests/conftest.py registers this module (``pytest_plugins``): test modules use the fixtures by name
and must not import them (an imported fixture is the module's own, and its reference runs would be
made once per module). Without the
oracle venv the reference fixture skips; under ``CI=true`` it fails.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tests.oracle_run import load_dump, run_oracle
from tests.requirement import require

REPO = Path(__file__).resolve().parents[1]
QWEN3_OMNI_ORACLE_PYTHON = REPO / ".venv-omni-oracle" / "bin" / "python"
QWEN3_OMNI_ORACLE_SCRIPT = REPO / "tests" / "oracle" / "qwen3_omni_reference.py"
QWEN3_OMNI_THREADS = 1  # the same on both sides: on CPU a prefill's bits depend on the thread count

# per shape: the writer's seed and rigs (<|im_end|> as answer token K, codec eos after F frames)
QWEN3_OMNI_SHAPES = {
    "tiny": {"seed": 0, "thinker_eos_after": 24, "talker_eos_after": 32},
    "tiny2": {"seed": 1, "thinker_eos_after": 17, "talker_eos_after": 21},
    "tiny3": {"seed": 2, "thinker_eos_after": 30, "talker_eos_after": 40},
}

QWEN3_OMNI_JOBS = [
    {"id": "en_ethan", "prompt": "Hello! Can you tell me a short story about a robot?", "speaker": "Ethan"},
    {"id": "zh_chelsie", "prompt": "你好，请用一句话介绍一下你自己。", "system": "You are a helpful assistant.",
     "speaker": "Chelsie"},
    {"id": "en_system_aiden", "prompt": "What is the capital of France?",
     "system": "You are a friendly voice assistant. Answer briefly.", "speaker": "Aiden"},
    {"id": "zh_multiturn_ethan", "speaker": "Ethan", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "今天天气怎么样？"}]},
        # long enough that the earlier assistant turn lies more than any rig's K tokens back
        {"role": "assistant", "content": [{"type": "text", "text": "今天天气晴朗，气温大约二十五度，微风，"
                                           "非常适合出门散步或者去公园野餐。下午可能会有一些云，但是不会下雨。"}]},
        {"role": "user", "content": [{"type": "text", "text": "那明天呢？"}]}]},
    # system messages as OpenAI's clients send them: two leading, one between turns (the template
    # renders each where it stands; the talker reads user turns only)
    {"id": "en_system_between_turns_aiden", "speaker": "Aiden", "messages": [
        {"role": "system", "content": [{"type": "text", "text": "You are a helpful assistant."}]},
        {"role": "system", "content": [{"type": "text", "text": "Answer briefly."}]},
        {"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "The capital of France is Paris, which is also "
                                           "its largest city, on the river Seine in the north of the country."}]},
        {"role": "system", "content": [{"type": "text", "text": "From now on, answer in French."}]},
        {"role": "user", "content": [{"type": "text", "text": "And what about Italy?"}]}]},
    {"id": "en_text_only", "prompt": "List three colors.", "return_audio": False},
    # the thinker stops at its token bound before the rigged <|im_end|>
    {"id": "mixed_thinker_bound_chelsie", "prompt": "Translate to English: 我喜欢编程。", "speaker": "Chelsie",
     "thinker_max_new_tokens": 9},
    # the talker stops at its token bound before the rigged eos
    {"id": "en_talker_bound_aiden", "prompt": "Count from one to ten, please.", "speaker": "Aiden",
     "talker_max_new_tokens": 12},
]


def require_qwen3_omni_oracle() -> None:
    """Skip the calling test (or fixture) when the Omni reference venv is missing; fail instead
    when ``CI`` is ``true``: there a missing oracle is a broken set-up, and a skipped parity test
    would pass unnoticed."""
    require(QWEN3_OMNI_ORACLE_PYTHON.exists(), f"reference venv missing: {QWEN3_OMNI_ORACLE_PYTHON} "
            "(run `make omni-oracle` or tests/oracle/omni_install.sh)")


def qwen3_omni_waveform_samples(frames: int, total_upsample: int = 1920, upsample_rates=(8, 5, 4, 3),
                                chunk_size: int = 300) -> int:
    """Samples the reference's ``code2wav.chunked_decode`` returns for ``frames`` frames: each
    causal transposed convolution of the decoder blocks yields ``(n - 1) * rate`` samples for ``n``
    inputs, so every decoded chunk is short of ``frames * total_upsample`` by a fixed amount
    (555 with the released rates)."""
    short, factor = 0, 1
    for rate in reversed(upsample_rates):
        factor *= rate
        short += factor
    return frames * total_upsample - short * math.ceil(frames / chunk_size)


def load_qwen3_omni_dump(out: Path) -> dict:
    """The oracle's output folder as ``{"meta": ..., "jobs": {id: {summary + arrays}}}``."""
    return load_dump(out)


def run_qwen3_omni_oracle(checkpoint: Path, jobs: list[dict], out: Path, timeout: float = 900) -> dict:
    """Run the reference over ``jobs`` for one checkpoint and load what it wrote."""
    return run_oracle("Qwen3-Omni", QWEN3_OMNI_ORACLE_PYTHON, QWEN3_OMNI_ORACLE_SCRIPT, checkpoint, jobs, out, QWEN3_OMNI_THREADS, timeout)


@pytest.fixture(scope="module")
def qwen3_omni_threads():
    """torch's thread count as the oracle runs (on CPU a prefill's bits depend on it) for a module."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(QWEN3_OMNI_THREADS)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def qwen3_omni_checkpoints(tmp_path_factory) -> dict[str, Path]:
    from omni_backend.models.qwen3_omni.random_checkpoint import write_random_checkpoint

    root = tmp_path_factory.mktemp("qwen3_omni_checkpoints")
    return {shape: Path(write_random_checkpoint(str(root / shape), shape, **rig))
            for shape, rig in QWEN3_OMNI_SHAPES.items()}


@pytest.fixture(scope="session")
def qwen3_omni_jobs() -> list[dict]:
    return [dict(job) for job in QWEN3_OMNI_JOBS]


@pytest.fixture(scope="session")
def qwen3_omni_reference(qwen3_omni_checkpoints, qwen3_omni_jobs, tmp_path_factory) -> dict[str, dict]:
    """One oracle run per shape over every job."""
    require_qwen3_omni_oracle()
    root = tmp_path_factory.mktemp("qwen3_omni_oracle")
    result = {}
    for shape, checkpoint in qwen3_omni_checkpoints.items():
        dump = run_qwen3_omni_oracle(checkpoint, qwen3_omni_jobs, root / shape)
        result[shape] = {"checkpoint": checkpoint, "out": root / shape, **dump}
    return result


# ----------------------------------------------------------------------------- audio input

# Recordings the audio jobs hear: name -> (seconds, sample rate, container). Signals are made here
# (a tone sweep with noise, seeded by the name), encoded in the container, then decoded and
# resampled by the server's own media module: what the reference receives is that 16-kHz waveform
# (its processor takes arrays; reading files and resampling come before it).
QWEN3_OMNI_RECORDINGS = {
    "sweep3s_16k_wav": (3.0, 16000, "wav"),
    "noise30s_16k_wav": (30.0, 16000, "wav"),
    "sweep2s_44k_flac": (2.0, 44100, "flac"),
    "sweep1s_44k_mp3": (1.3, 44100, "mp3"),
    "tone_half_s_16k_wav": (0.5, 16000, "wav"),
}
_HISTORY_ANSWER = ("It says that the weather will be sunny tomorrow, with a light breeze in the afternoon and "
                   "a temperature of about twenty five degrees, perfect for a walk in the park.")
# {"type": "input_audio", "recording": NAME} parts stand for a recording (see recording_part)
QWEN3_OMNI_AUDIO_JOBS = [
    {"id": "audio_only_ethan", "speaker": "Ethan", "messages": [
        {"role": "user", "content": [{"type": "input_audio", "recording": "sweep3s_16k_wav"}]}]},
    {"id": "audio_question_30s_chelsie", "speaker": "Chelsie", "messages": [
        {"role": "user", "content": [{"type": "input_audio", "recording": "noise30s_16k_wav"},
                                     {"type": "text", "text": "What is said in this recording?"}]}]},
    {"id": "audio_44k_flac_aiden", "speaker": "Aiden", "system": "You are a helpful assistant.", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Listen:"},
                                     {"type": "input_audio", "recording": "sweep2s_44k_flac"},
                                     {"type": "text", "text": "Describe the sound."}]}]},
    {"id": "two_recordings_mp3_ethan", "speaker": "Ethan", "messages": [
        {"role": "user", "content": [{"type": "input_audio", "recording": "sweep1s_44k_mp3"},
                                     {"type": "input_audio", "recording": "tone_half_s_16k_wav"},
                                     {"type": "text", "text": "Which of the two is louder?"}]}]},
    {"id": "multiturn_earlier_audio_chelsie", "speaker": "Chelsie", "messages": [
        {"role": "user", "content": [{"type": "input_audio", "recording": "sweep3s_16k_wav"},
                                     {"type": "text", "text": "What does it say?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": _HISTORY_ANSWER}]},
        {"role": "user", "content": [{"type": "text", "text": "Say it again, in fewer words."}]}]},
    {"id": "audio_text_answer_only", "speaker": "Ethan", "return_audio": False, "messages": [
        {"role": "user", "content": [{"type": "input_audio", "recording": "tone_half_s_16k_wav"},
                                     {"type": "text", "text": "Transcribe it."}]}]},
]


def recording_bytes(name: str) -> bytes:
    """The encoded file of recording ``name`` (deterministic)."""
    import io
    import zlib

    import soundfile as sf

    seconds, rate, container = QWEN3_OMNI_RECORDINGS[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    t = np.arange(int(seconds * rate)) / rate
    sweep = 0.3 * np.sin(2 * np.pi * (200 + 300 * t / max(seconds, 1e-3)) * t)
    signal = (sweep + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
    subtype = {"wav": "FLOAT", "flac": "PCM_16", "mp3": "MPEG_LAYER_III"}[container]
    handle = io.BytesIO()
    sf.write(handle, signal, rate, format=container.upper(), subtype=subtype)
    return handle.getvalue()


def recording_part(name: str) -> dict:
    """OpenAI's ``input_audio`` content part of recording ``name``."""
    import base64

    container = QWEN3_OMNI_RECORDINGS[name][2]
    return {"type": "input_audio",
            "input_audio": {"data": base64.b64encode(recording_bytes(name)).decode(), "format": container}}


def audio_job_messages(job: dict, form: str) -> list[dict]:
    """A job's messages with each recording and image as ``form``: "openai" (``input_audio`` and
    ``image_url`` parts) or a folder path string for the oracle (``{"type": "audio", "audio_npy":
    ...}`` and ``{"type": "image", "image_png": ...}`` parts; the files are written there: what the
    server's media module decodes)."""
    from omni_backend.models.qwen3_omni.media import decode_input_audio

    out = []
    if job.get("system"):
        out.append({"role": "system", "content": [{"type": "text", "text": job["system"]}]})
    for message in job["messages"]:
        parts = []
        for part in message["content"]:
            if part["type"] == "image_url":
                if form == "openai":
                    parts.append(image_part(part["image"]))
                else:
                    path = Path(form) / f"{part['image']}.png"
                    if not path.exists():
                        from omni_backend.models.qwen3_omni.media import decode_image_url

                        decode_image_url(image_part(part["image"]), "part").save(path, format="PNG")
                    parts.append({"type": "image", "image_png": str(path)})
            elif part["type"] != "input_audio":
                parts.append(part)
            elif form == "openai":
                parts.append(recording_part(part["recording"]))
            else:
                path = Path(form) / f"{part['recording']}.npy"
                if not path.exists():
                    recording = decode_input_audio(recording_part(part["recording"]), "part", 16000, 160)
                    np.save(path, recording.waveform)
                parts.append({"type": "audio", "audio_npy": str(path)})
        out.append({**message, "content": parts})
    return out


@pytest.fixture(scope="session")
def qwen3_omni_audio_reference(qwen3_omni_checkpoints, tmp_path_factory) -> dict[str, dict]:
    """One oracle run per shape over every audio and image job: ``{shape: {"jobs": {id: ...}, ...}}``."""
    require_qwen3_omni_oracle()
    root = tmp_path_factory.mktemp("qwen3_omni_audio_oracle")
    recordings = root / "recordings"
    recordings.mkdir()
    jobs = [{key: value for key, value in job.items() if key not in ("messages", "system")}
            | {"messages": audio_job_messages(job, str(recordings))}
            for job in QWEN3_OMNI_AUDIO_JOBS + QWEN3_OMNI_IMAGE_JOBS]
    result = {}
    for shape, checkpoint in qwen3_omni_checkpoints.items():
        dump = run_qwen3_omni_oracle(checkpoint, jobs, root / shape)
        result[shape] = {"checkpoint": checkpoint, "out": root / shape, **dump}
    return result


# ----------------------------------------------------------------------------- image input

# Images the image jobs see: name -> (width, height, container). Pixels are made here (noise with a
# gradient, seeded by the name), encoded, and decoded by the server's media module; the reference
# reads that decoded image (saved losslessly as PNG).
QWEN3_OMNI_IMAGES = {
    "square64_png": (64, 64, "PNG"),
    "wide640x360_jpeg": (640, 360, "JPEG"),
    "tall90x300_png_alpha": (90, 300, "PNG"),
}
QWEN3_OMNI_IMAGE_JOBS = [
    {"id": "image_only_ethan", "speaker": "Ethan", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image": "square64_png"}]}]},
    {"id": "image_question_wide_chelsie", "speaker": "Chelsie", "system": "You are a helpful assistant.",
     "messages": [{"role": "user", "content": [{"type": "image_url", "image": "wide640x360_jpeg"},
                                               {"type": "text", "text": "What is in this picture?"}]}]},
    {"id": "audio_image_text_aiden", "speaker": "Aiden", "messages": [
        {"role": "user", "content": [{"type": "input_audio", "recording": "sweep3s_16k_wav"},
                                     {"type": "image_url", "image": "tall90x300_png_alpha"},
                                     {"type": "text", "text": "Does the sound match the picture?"}]}]},
    {"id": "multiturn_earlier_image_ethan", "speaker": "Ethan", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Look at this."},
                                     {"type": "image_url", "image": "square64_png"}]},
        {"role": "assistant", "content": [{"type": "text", "text": _HISTORY_ANSWER}]},
        {"role": "user", "content": [{"type": "text", "text": "And what colour dominates?"}]}]},
]


def image_bytes(name: str) -> bytes:
    import io
    import zlib

    from PIL import Image

    width, height, container = QWEN3_OMNI_IMAGES[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    channels = 4 if name.endswith("alpha") else 3
    gradient = np.linspace(0, 200, width, dtype=np.float64)[None, :, None]
    pixels = np.clip(rng.integers(0, 56, (height, width, channels)) + gradient, 0, 255).astype(np.uint8)
    handle = io.BytesIO()
    Image.fromarray(pixels, "RGBA" if channels == 4 else "RGB").save(handle, format=container)
    return handle.getvalue()


def image_part(name: str) -> dict:
    import base64

    media_type = "image/jpeg" if QWEN3_OMNI_IMAGES[name][2] == "JPEG" else "image/png"
    return {"type": "image_url",
            "image_url": {"url": f"data:{media_type};base64,{base64.b64encode(image_bytes(name)).decode()}"}}
