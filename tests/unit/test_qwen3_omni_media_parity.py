"""Qwen3-Omni hears and sees: audio and image input parity against the reference (transformers
5's ``qwen3_omni_moe`` with its Whisper feature extractor and its image processor's PIL backend,
greedy) on three random checkpoint shapes.

Audio jobs: a recording alone, a 30-s recording with a question, a 44.1-kHz FLAC between two text
parts with a system prompt, two recordings (MP3 at 44.1 kHz and WAV) in one message, a multi-turn
chat whose earlier turn held audio, and a text-only answer to audio. Image jobs: a small square PNG
alone, a large non-square JPEG with a question, audio + an RGBA PNG + text in one message, and a
multi-turn chat whose earlier turn held an image. For each: our prompt ids (placeholders expanded as
the processor expands them), the thinker's tokens (3-D rotary positions and deepstack features for
images) and the talker's codes (its own 3-D positions) equal the reference's bit for bit; the
waveform is within 1e-4. Bad recordings and images are refused naming the part.
"""
from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from omni_backend.errors import InvalidRequest
from omni_backend.models.qwen3_omni.checkpoint import load_checkpoint
from omni_backend.models.qwen3_omni.generate import Sampling, generate
from omni_backend.models.qwen3_omni.prompt import PromptError
from tests.qwen3_omni_fixtures import (QWEN3_OMNI_AUDIO_JOBS, QWEN3_OMNI_IMAGE_JOBS, QWEN3_OMNI_SHAPES,
                                       audio_job_messages, image_part, recording_part)

SHAPES = tuple(QWEN3_OMNI_SHAPES)
JOBS = {job["id"]: job for job in QWEN3_OMNI_AUDIO_JOBS + QWEN3_OMNI_IMAGE_JOBS}
JOB_IDS = tuple(JOBS)
WAVEFORM_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def checkpoints(qwen3_omni_checkpoints, qwen3_omni_threads):
    return {shape: load_checkpoint(str(path)) for shape, path in qwen3_omni_checkpoints.items()}


@pytest.fixture(scope="module")
def ours(checkpoints, qwen3_omni_audio_reference):
    """Our generate() for every shape and audio job, the recordings sent as OpenAI input_audio parts."""
    results = {}
    for shape, checkpoint in checkpoints.items():
        for job_id, ref in qwen3_omni_audio_reference[shape]["jobs"].items():
            job = ref["job"]
            results[shape, job_id] = generate(
                checkpoint, messages=audio_job_messages(JOBS[job_id], "openai"), speaker=job["speaker"],
                return_audio=bool(job["return_audio"]), thinker_max_new_tokens=int(job["thinker_max_new_tokens"]),
                talker_max_new_tokens=int(job["talker_max_new_tokens"]),
                talker_sampling=Sampling(repetition_penalty=float(job["talker_repetition_penalty"])))
    return results


@pytest.mark.parametrize("job_id", JOB_IDS)
@pytest.mark.parametrize("shape", SHAPES)
def test_audio_job_equals_reference(ours, qwen3_omni_audio_reference, shape, job_id):
    ref = qwen3_omni_audio_reference[shape]["jobs"][job_id]
    result = ours[shape, job_id]
    assert result.prompt_ids == ref["input_ids"].tolist()
    assert result.prompt_ids.count(151675) + result.prompt_ids.count(151655) > 1   # placeholders expanded
    assert result.sequence == ref["sequences"].tolist()
    assert len(result.sequence) - len(result.prompt_ids) >= 4   # a real answer, not eos at once
    if not ref["job"]["return_audio"]:
        assert result.codes is None and "codes" not in ref
        return
    assert torch.equal(result.codes, torch.from_numpy(ref["codes"]))
    assert result.waveform.shape[0] == ref["waveform"].shape[0]
    assert float(np.max(np.abs(result.waveform.numpy() - ref["waveform"]))) <= WAVEFORM_TOLERANCE


def test_media_change_the_answer(ours):
    """What is heard and seen matters: every job's speech differs from every other's."""
    first = ours["tiny", "audio_only_ethan"]
    codes = {job_id: ours["tiny", job_id].codes for job_id in JOB_IDS if ours["tiny", job_id].codes is not None}
    assert len({tuple(c.flatten().tolist()) for c in codes.values()}) == len(codes)
    assert first.prompt_ids.count(151675) == 39      # 3 s: 300 mel frames -> 3 * 13 audio tokens
    # 640x360 -> 640x352 after the 32-pixel rounding: 40 x 22 patches, 220 tokens
    assert ours["tiny", "image_question_wide_chelsie"].prompt_ids.count(151655) == 220


def test_placeholder_count_follows_the_reference(qwen3_omni_audio_reference):
    """Counts from the reference's own prompt: 30 s -> 390 audio tokens (13 per second)."""
    ids = qwen3_omni_audio_reference["tiny"]["jobs"]["audio_question_30s_chelsie"]["input_ids"].tolist()
    assert ids.count(151675) == 390


def _builder(checkpoints):
    return checkpoints["tiny"].prompt_builder()


@pytest.mark.parametrize("part, field, message", [
    ({"type": "input_audio", "input_audio": {"data": base64.b64encode(b"not audio at all").decode(),
                                             "format": "wav"}}, ".input_audio.data", "not audio"),
    ({"type": "input_audio", "input_audio": {"data": "%%%", "format": "wav"}}, ".input_audio.data", "base64"),
    ({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}, ".input_audio.data", "base64"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "aiff"}}, ".input_audio.format", "one of"),
    ({"type": "input_audio", "input_audio": "x"}, ".input_audio", "must be an object"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "url": "x"}}, ".input_audio.url", "unknown field"),
    ({"type": "video_url", "video_url": {"url": "x"}}, "", "must be"),
    ({"type": "text", "text": "a <|audio_pad|> b"}, ".text", "placeholder"),
    ({"type": "text", "text": "a <|image_pad|> b"}, ".text", "placeholder"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,bm90IGFuIGltYWdl"}}, ".image_url.url",
     "not an image"),
    ({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}, ".image_url.url",
     "does not fetch"),
    ({"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGk="}}, ".image_url.url", "data URL of an image"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}, ".image_url.url", "base64"),
    ({"type": "image_url", "image_url": {"url": "x", "size": 3}}, ".image_url.size", "unknown field"),
    ({"type": "image_url", "image_url": 7}, ".image_url", "must be an object"),
])
def test_bad_parts_name_the_part(checkpoints, part, field, message):
    with pytest.raises(InvalidRequest) as error:
        _builder(checkpoints).build_prompt(messages=[{"role": "user", "content": [part]}])
    assert error.value.field == f"messages[0].content[0]{field}"
    assert message in error.value.reason


def test_too_long_and_too_short_recordings_say_the_limit(checkpoints):
    import io

    import soundfile as sf

    def wav(seconds: float) -> dict:
        handle = io.BytesIO()
        sf.write(handle, np.zeros(int(16000 * seconds), np.float32), 16000, format="WAV", subtype="PCM_16")
        return {"type": "input_audio", "input_audio": {"data": base64.b64encode(handle.getvalue()).decode()}}

    builder = _builder(checkpoints)
    with pytest.raises(InvalidRequest, match=r"too long \(121\.00 s; at most 120 s\)"):
        builder.build_prompt(messages=[{"role": "user", "content": [wav(121)]}])
    with pytest.raises(InvalidRequest, match="too short"):
        builder.build_prompt(messages=[{"role": "user", "content": [wav(0.005)]}])


def _png(width: int, height: int) -> dict:
    import io

    from PIL import Image

    handle = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(handle, format="PNG")
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(handle.getvalue()).decode()}}


def _png_header(width: int, height: int) -> dict:
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(raw).decode()}}


def test_huge_and_thin_images_are_refused(checkpoints):
    builder = _builder(checkpoints)
    with pytest.raises(InvalidRequest, match="too large .*pixels"):
        builder.build_prompt(messages=[{"role": "user", "content": [_png(8000, 6000)]}])
    with pytest.raises(InvalidRequest, match="aspect ratio"):
        builder.build_prompt(messages=[{"role": "user", "content": [_png(1000, 4)]}])
    # a header of 20000 x 20000 pixels: PIL refuses it as a bomb when it opens it
    with pytest.raises(InvalidRequest, match="too large .*pixels"):
        builder.build_prompt(messages=[{"role": "user", "content": [_png_header(20000, 20000)]}])
    # a small image is scaled up to the processor's minimum area, a large one down to its maximum
    small = builder.build_prompt(messages=[{"role": "user", "content": [_png(10, 10)]}])
    assert small.images[0].grid == (1, 4, 4)


def test_audio_only_in_user_turns(checkpoints):
    with pytest.raises(PromptError) as error:
        _builder(checkpoints).build_prompt(messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [recording_part("tone_half_s_16k_wav")]},
            {"role": "user", "content": "and?"}])
    assert error.value.field == "messages[1].content[0]"
    with pytest.raises(PromptError, match="user messages only"):
        _builder(checkpoints).build_prompt(messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [image_part("square64_png")]},
            {"role": "user", "content": "and?"}])
