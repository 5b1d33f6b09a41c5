"""Voice cloning on a tiny random ``base`` checkpoint, against the reference ``generate_voice_clone``
(greedy), with real speech (the embedded English voice, hibari) as the reference audio.

- the speech-tokenizer encoder's codes and the speaker encoder's x-vector equal the reference's
  bit for bit (also for a 12 s recording, longer than the encoder's 250-step attention window);
- our engine's greedy codes equal the reference's bit for bit, in-context (ICL, streaming-text
  and non-streaming) and x-vector-only modes, all cases batched in one engine;
- the audio after the reference part is cut: same length, max abs difference <= 1e-4;
- the prompt's ids (ref text, text) equal the reference wrapper's.
"""
from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
import torch

from omni_backend.engine import SamplingParams
from omni_backend.models.qwen3_tts.code2wav import Code2Wav
from omni_backend.models.qwen3_tts.prompt import PromptError, VoiceClonePrompt, reference_cut_samples
from omni_backend.models.qwen3_tts.runner import create_engine
from omni_backend.models.qwen3_tts.speaker_encoder import mel_filterbank
from omni_backend.models.qwen3_tts.voice_clone import VoiceEncoder
from tests.qwen3_fixtures import QWEN3_ORACLE_PYTHON, QWEN3_THREADS, REPO, require_qwen3_oracle

ORACLE_SCRIPT = REPO / "tests" / "oracle" / "qwen3_voice_clone_reference.py"

REF_TEXT = "Hello there, this is a short reference recording of my voice."
LONG_REF_TEXT = ("This is a much longer reference recording. It goes on for a while, so that the encoder sees "
                 "more than ten seconds of speech, and its attention has to reach back over every step before it, "
                 "which is how the reference computes it.")
SHORT_REF_TEXT = "Good morning."

CASES = [
    {"id": "icl_en", "text": "The quick brown fox jumps over the lazy dog.", "audio": "ref", "ref_text": REF_TEXT,
     "language": "English", "max_new_tokens": 12, "decode": True},
    {"id": "icl_nonstream", "text": "Streaming text is off for this one.", "audio": "ref", "ref_text": REF_TEXT,
     "language": "English", "non_streaming_mode": True, "max_new_tokens": 10, "decode": True},
    {"id": "icl_short_ref_long_text", "audio": "short", "ref_text": SHORT_REF_TEXT, "language": "auto",
     "text": "A long text over a short reference: more text tokens than reference frames, so part of the text "
             "trails behind and enters one token per generated frame, all the way to the end of this sentence.",
     "max_new_tokens": 12, "repetition_penalty": 1.3},
    {"id": "icl_long_ref", "text": "Hello again.", "audio": "long", "ref_text": LONG_REF_TEXT,
     "max_new_tokens": 8},
    {"id": "xvec_en", "text": "Only the speaker embedding is used here.", "audio": "ref", "x_vector_only_mode": True,
     "language": "English", "max_new_tokens": 12, "decode": True},
    {"id": "xvec_zh", "text": "你好，世界。今天天气很好。", "audio": "long", "x_vector_only_mode": True,
     "language": "Chinese", "max_new_tokens": 10},
]

pytestmark = [pytest.mark.oracle, pytest.mark.usefixtures("qwen3_threads")]




@pytest.fixture(scope="module")
def audios(tmp_path_factory) -> dict[str, np.ndarray]:
    from hibari import Hibari

    voice = Hibari()
    return {"ref": voice(REF_TEXT, seed=0), "long": voice(LONG_REF_TEXT, seed=1),
            "short": voice(SHORT_REF_TEXT, seed=2)}


@pytest.fixture(scope="module")
def base_checkpoint(qwen3_checkpoint_factory):
    return qwen3_checkpoint_factory("tiny", "base", seed=5)


@pytest.fixture(scope="module")
def reference(base_checkpoint, audios, tmp_path_factory) -> dict:
    require_qwen3_oracle()
    work = tmp_path_factory.mktemp("qwen3_voice_clone_oracle")
    files = {}
    for name, audio in audios.items():
        np.save(work / f"{name}.npy", audio.astype(np.float32))
        files[name] = str(work / f"{name}.npy")
    (work / "jobs.json").write_text(json.dumps({"checkpoint": str(base_checkpoint), "audio": files,
                                                "cases": CASES}, ensure_ascii=False))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run([str(QWEN3_ORACLE_PYTHON), str(ORACLE_SCRIPT), "--jobs", str(work / "jobs.json"),
                           "--out", str(work / "out.npz"), "--threads", str(QWEN3_THREADS)],
                          capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"oracle failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    with np.load(work / "out.npz") as data:
        return {key: data[key] for key in data.files}


@pytest.fixture(scope="module")
def loaded(base_checkpoint, qwen3_loaded):
    return qwen3_loaded(base_checkpoint)


@pytest.fixture(scope="module")
def voice_encoder(base_checkpoint, loaded) -> VoiceEncoder:
    return VoiceEncoder.from_checkpoint(str(base_checkpoint), dict(loaded.config.speaker_encoder))


def _prompt(builder, voice_encoder, audios, case):
    clone = voice_encoder.encode(audios[case["audio"]], 24000, case.get("ref_text"),
                                 bool(case.get("x_vector_only_mode", False)))
    return builder.build(case["text"], language=case.get("language"), non_streaming_mode=case.get("non_streaming_mode"),
                         voice_clone=clone)


def test_encoders_equal_reference(voice_encoder, audios, reference):
    for name, audio in audios.items():
        ours = voice_encoder.speech_encoder.encode(audio).numpy()
        assert np.array_equal(ours, reference[f"encode/{name}"]), name
    assert reference["encode/long"].shape[0] > 125  # > 250 encoder-transformer steps at 25 Hz
    for case in CASES:
        xvec = voice_encoder.speaker_encoder.embed(audios[case["audio"]]).numpy()
        assert np.array_equal(xvec, reference[f"xvector/{case['id']}"]), case["id"]
        if not case.get("x_vector_only_mode"):
            assert np.array_equal(voice_encoder.speech_encoder.encode(audios[case["audio"]]).numpy(),
                                  reference[f"ref_code/{case['id']}"]), case["id"]


def test_mel_filterbank_shape():
    bank = mel_filterbank()
    assert bank.shape == (128, 513) and bank.dtype == np.float32
    assert bank[:, 513 * 12000 // 12000:].sum() == 0  # nothing above fmax (12 kHz = bin 512)


def test_prompt_ids_equal_reference(loaded, voice_encoder, audios, reference):
    builder = loaded.prompt_builder()
    for case in CASES:
        prompt = _prompt(builder, voice_encoder, audios, case)
        assert list(prompt.input_ids) == reference[f"input_ids/{case['id']}"].tolist()
        if not case.get("x_vector_only_mode"):
            assert list(prompt.voice_clone.ref_text_ids) == reference[f"ref_ids/{case['id']}"][3:-2].tolist()


def test_greedy_codes_equal_reference(loaded, voice_encoder, audios, reference):
    engine = create_engine(loaded, max_num_seqs=4, max_model_len=512, num_threads=QWEN3_THREADS)
    builder = loaded.prompt_builder()
    pending = []
    for case in CASES:
        params = SamplingParams.greedy(max_new_tokens=case["max_new_tokens"],
                                       repetition_penalty=case.get("repetition_penalty", 1.05))
        pending.append((case["id"], _prompt(builder, voice_encoder, audios, case), params))
    frames: dict[str, list] = {case["id"]: [] for case in CASES}
    step = 0
    while pending or engine.has_unfinished():
        if pending and step % 2 == 0:
            engine.add_request(*pending.pop(0))
        for event in engine.step():
            if event.codes is not None:
                frames[event.request_id].append(event.codes)
        step += 1
    for case in CASES:
        ours = np.asarray(frames[case["id"]], dtype=np.int64).reshape(-1, 16)
        ref = reference[f"codes/{case['id']}"]
        assert ref.shape[0] > 0
        assert ours.shape == ref.shape and np.array_equal(ours, ref), case["id"]


def test_audio_cut_matches_reference(base_checkpoint, reference):
    code2wav = Code2Wav.from_checkpoint(os.path.join(str(base_checkpoint), "speech_tokenizer"))
    for case in CASES:
        if not case.get("decode"):
            continue
        cid = case["id"]
        new = torch.from_numpy(reference[f"codes/{cid}"])
        ref_codes = torch.from_numpy(reference[f"ref_code/{cid}"]) if f"ref_code/{cid}" in reference else None
        codes = new if ref_codes is None else torch.cat([ref_codes, new], dim=0)
        audio = code2wav.decode(codes.T.unsqueeze(0))[0].numpy()
        full = reference[f"full_wav/{cid}"]
        assert audio.shape == full.shape
        cut = 0 if ref_codes is None else reference_cut_samples(ref_codes.shape[0], new.shape[0], audio.shape[0])
        ours = audio[cut:]
        ref = reference[f"wav/{cid}"]
        assert ours.shape == ref.shape, cid
        assert np.abs(ours - ref).max() <= 1e-4, cid
        if ref_codes is not None:  # the cut lands within a sample of the frame boundary
            assert abs(cut - ref_codes.shape[0] * 1920) <= 1


def test_base_checkpoint_needs_a_voice(loaded, voice_encoder, audios):
    builder = loaded.prompt_builder()
    with pytest.raises(PromptError, match="^invalid_request: ref_audio:"):
        builder.build("Hello.")
    with pytest.raises(PromptError, match="^invalid_request: ref_text:"):
        voice_encoder.encode(audios["ref"], 24000, None, x_vector_only=False)
    clone = VoiceClonePrompt(speaker_embedding=torch.zeros(7))
    with pytest.raises(PromptError, match="^invalid_request: ref_audio:"):
        builder.build("Hello.", voice_clone=clone)
    good = voice_encoder.encode(audios["ref"], 24000, None, x_vector_only=True)
    with pytest.raises(PromptError, match="^invalid_request: instructions:"):
        builder.build("Hello.", instruct="Whisper.", voice_clone=good)
