"""VoxCPM2 in process against the reference (voxcpm 2.0.3, by subprocess) on three random shapes
and six requests (English, Chinese, long, mixed, two with a cloning recording and its transcript):
same tokens, the same latent patches for the same seed within LATENT_ATOL, the waveform within
1e-4; the recording's prompt patches equal; the AudioVAE's windowed decode joins to the whole."""
from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import torch

from omni_backend.models.voxcpm2.audio_vae import decoder_left_context
from omni_backend.models.voxcpm2.generate import decode_whole, generate_latents, patches_to_latents
from omni_backend.models.voxcpm2.model import load_model
from omni_backend.models.voxcpm2.prompt import build_prompt, controlled_text, encode_recording
from omni_backend.models.voxcpm2.tokenizer import TextTokenizer
from tests.voxcpm2_fixtures import LATENT_ATOL, VOXCPM2_SHAPES, VOXCPM2_THREADS, WAVEFORM_ATOL


@pytest.fixture(scope="module", autouse=True)
def _threads():
    before = torch.get_num_threads()
    torch.set_num_threads(VOXCPM2_THREADS)
    yield
    torch.set_num_threads(before)


def _request(job: dict) -> dict:
    return {k: job[k] for k in ("min_len", "max_len", "inference_timesteps", "cfg_value") if k in job}


@pytest.mark.parametrize("shape", sorted(VOXCPM2_SHAPES))
def test_generate_equals_reference(shape, voxcpm2_reference, voxcpm2_jobs):
    ref = voxcpm2_reference[shape]
    model, vae = load_model(str(ref["checkpoint"]), dtype=torch.float32)
    tokenize = TextTokenizer(str(ref["checkpoint"]))
    lengths = []
    for job in voxcpm2_jobs:
        want = ref["jobs"][job["id"]]
        prompt_feat = ref_feat = None
        if job.get("prompt_wav"):
            audio, _ = sf.read(job["prompt_wav"], dtype="float32")
            prompt_feat = encode_recording(vae, torch.from_numpy(audio), model.patch_size, "left")
            np.testing.assert_allclose(prompt_feat.numpy(), want["prompt_patches"], atol=LATENT_ATOL, rtol=0)
        if job.get("reference_wav"):
            audio, _ = sf.read(job["reference_wav"], dtype="float32")
            ref_feat = encode_recording(vae, torch.from_numpy(audio), model.patch_size, "right")
            np.testing.assert_allclose(ref_feat.numpy(), want["ref_patches"], atol=LATENT_ATOL, rtol=0)
        text = controlled_text(job["text"], job.get("control"))
        prompt = build_prompt(tokenize, text, model.patch_size, model.feat_dim, job.get("prompt_text", ""),
                              prompt_feat, ref_feat)
        if ref_feat is not None:
            assert prompt.text_token[0] == 103 and len(prompt) > len(want["text_token"]) + ref_feat.shape[0]
        text = prompt.text_token[prompt.text_mask.bool()][2:] if ref_feat is not None else prompt.text_token
        assert text[:len(want["text_token"])].tolist() == want["text_token"].tolist(), job["id"]
        gen = generate_latents(model, prompt, seed=job["seed"], **_request(job))
        assert gen.patches.shape == want["patches"].shape, job["id"]
        np.testing.assert_allclose(gen.patches.numpy(), want["patches"], atol=LATENT_ATOL, rtol=0,
                                   err_msg=f"{shape}/{job['id']}")
        audio = decode_whole(vae, gen).numpy()
        assert audio.shape == want["waveform"].shape
        np.testing.assert_allclose(audio, want["waveform"], atol=WAVEFORM_ATOL, rtol=0, err_msg=job["id"])
        lengths.append(gen.patches.shape[0])
    assert len(set(lengths)) > 2, lengths        # the jobs end at different lengths


@pytest.mark.parametrize("shape", sorted(VOXCPM2_SHAPES))
def test_windowed_decode_joins_to_whole(shape, voxcpm2_checkpoints):
    """Stateless windows (left context from decoder_left_context) give the whole decode's samples."""
    _, vae = load_model(str(voxcpm2_checkpoints[shape]), dtype=torch.float32)
    cfg = vae.config
    z = torch.randn(1, cfg.latent_dim, 57, generator=torch.Generator().manual_seed(0))
    hop = cfg.decode_hop_length
    with torch.inference_mode():
        whole = vae.decode(z)[0, 0]
        left = decoder_left_context(cfg)
        pieces, start = [], 0
        for new in (1, 3, 7, 20, 26):
            ctx = min(left, start)
            out = vae.decode(z[..., start - ctx:start + new])[0, 0]
            pieces.append(out[ctx * hop:])
            start += new
    joined = torch.cat(pieces)
    assert joined.shape == whole.shape
    np.testing.assert_allclose(joined.numpy(), whole.numpy(), atol=1e-5, rtol=0)
    # a window with too little context differs: the bound is not loose by accident
    with torch.inference_mode():
        short = vae.decode(z[..., 30 - 1:40])[0, 0][hop:]
    assert not np.allclose(short.numpy(), whole[30 * hop:40 * hop].numpy(), atol=1e-5)


def test_reference_streaming_decode_is_the_whole_decode_without_context(voxcpm2_reference):
    """Which reference decode the served audio joins to: zero-shot, the reference's own stateful
    streaming decode equals its whole decode; with a recording, its streaming decode starts cold
    (no context patches), so served audio follows the whole decode (generate())."""
    jobs = voxcpm2_reference["tiny"]["jobs"]
    np.testing.assert_allclose(jobs["en"]["streaming_waveform"], jobs["en"]["waveform"], atol=1e-5)
    clone = jobs["clone_en"]
    assert clone["streaming_waveform"].shape == clone["waveform"].shape
    assert np.abs(clone["streaming_waveform"] - clone["waveform"]).max() > 1e-3
