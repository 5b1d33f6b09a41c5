"""A VoxCPM2 cloning recording at another rate than the VAE's (a 44.1-kHz stereo wav, a 22.05-kHz
16-bit mono wav) is resampled as the reference's ``librosa.load(sr=16000, mono=True)`` (soxr at
``soxr_hq``): the samples equal librosa's bit for bit, and the prompt patches and the generated
latents equal the reference's (voxcpm 2.0.3, by subprocess) within LATENT_ATOL."""
from __future__ import annotations

import base64
import subprocess

import numpy as np
import pytest
import soundfile as sf
import torch

from omni_backend.reference_audio import decode_reference_audio
from omni_backend.models.voxcpm2.generate import generate_latents
from omni_backend.models.voxcpm2.model import load_model
from omni_backend.models.voxcpm2.prompt import build_prompt
from omni_backend.models.voxcpm2.recording import recording_patches, resample_as_reference
from omni_backend.models.voxcpm2.tokenizer import TextTokenizer
from tests.voxcpm2_fixtures import (LATENT_ATOL, VOXCPM2_ORACLE_PYTHON, VOXCPM2_THREADS, require_voxcpm2_oracle,
                                    run_voxcpm2_oracle)

RECORDINGS = {"r44k": (44100, 2, "FLOAT"), "r22k": (22050, 1, "PCM_16")}   # rate, channels, subtype


def _samples(rate: int, channels: int, seconds: float = 1.3) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(rate)
    left = 0.3 * np.sin(2 * np.pi * 180 * t * (1 + t)) + 0.02 * rng.standard_normal(t.size)
    if channels == 1:
        return left.astype(np.float32)
    right = 0.2 * np.sin(2 * np.pi * 330 * t) + 0.02 * rng.standard_normal(t.size)
    return np.stack([left, right], axis=1).astype(np.float32)


@pytest.fixture(scope="module")
def recordings(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("voxcpm2_rates")
    out = {}
    for name, (rate, channels, subtype) in RECORDINGS.items():
        path = root / f"{name}.wav"
        sf.write(str(path), _samples(rate, channels), rate, subtype=subtype)
        out[name] = path
    return out


@pytest.fixture(scope="module")
def librosa_loads(recordings, tmp_path_factory) -> dict:
    """What the reference's ``_encode_wav`` reads: ``librosa.load(path, sr=16000, mono=True)``."""
    require_voxcpm2_oracle()
    root = tmp_path_factory.mktemp("voxcpm2_librosa")
    out = {}
    for name, path in recordings.items():
        dump = root / f"{name}.npy"
        subprocess.run([str(VOXCPM2_ORACLE_PYTHON), "-c",
                        "import sys, librosa, numpy as np; y, _ = librosa.load(sys.argv[1], sr=16000, mono=True); "
                        "np.save(sys.argv[2], y)", str(path), str(dump)], check=True, timeout=300)
        out[name] = np.load(dump)
    return out


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_resampled_samples_equal_librosa(recordings, librosa_loads, name):
    audio, rate = decode_reference_audio(base64.b64encode(recordings[name].read_bytes()).decode())
    assert rate == RECORDINGS[name][0]
    ours = resample_as_reference(audio, rate, 16000)
    assert ours.dtype == np.float32 and ours.shape == librosa_loads[name].shape
    np.testing.assert_array_equal(ours, librosa_loads[name])


def test_prompt_and_latents_equal_reference(recordings, voxcpm2_checkpoints, tmp_path_factory):
    require_voxcpm2_oracle()
    checkpoint = voxcpm2_checkpoints["tiny"]
    jobs = [{"id": name, "text": "Hello again.", "prompt_text": "the reference speaks.", "prompt_wav": str(path),
             "seed": 4, "min_len": 3, "max_len": 6, "inference_timesteps": 3} for name, path in recordings.items()]
    ref = run_voxcpm2_oracle(checkpoint, jobs, tmp_path_factory.mktemp("voxcpm2_rates_oracle"))
    before = torch.get_num_threads()
    torch.set_num_threads(VOXCPM2_THREADS)
    try:
        model, vae = load_model(str(checkpoint), dtype=torch.float32)
        tokenize = TextTokenizer(str(checkpoint))
        for job in jobs:
            want = ref["jobs"][job["id"]]
            data_url = "data:audio/wav;base64," + base64.b64encode(recordings[job["id"]].read_bytes()).decode()
            feat = recording_patches(vae, data_url, model.patch_size)
            assert feat.shape == want["prompt_patches"].shape, job["id"]
            np.testing.assert_allclose(feat.numpy(), want["prompt_patches"], atol=LATENT_ATOL, rtol=0,
                                       err_msg=job["id"])
            prompt = build_prompt(tokenize, job["text"], model.patch_size, model.feat_dim, job["prompt_text"], feat)
            gen = generate_latents(model, prompt, seed=job["seed"], min_len=job["min_len"], max_len=job["max_len"],
                                   inference_timesteps=job["inference_timesteps"])
            assert gen.patches.shape == want["patches"].shape, job["id"]
            np.testing.assert_allclose(gen.patches.numpy(), want["patches"], atol=LATENT_ATOL, rtol=0,
                                       err_msg=job["id"])
    finally:
        torch.set_num_threads(before)
