"""VoxCPM2's runner on the shared AR engine, in process: 8 requests of different lengths,
timesteps and seeds served together equal each one's ``generate_latents`` run alone: bit for bit
with ``batch_invariant`` (rows alone), within float32 rounding with batched rows; the stop head
ends requests at different lengths; a bad knob names its field.

The static step (the CUDA path's step over static buffers, which graphs capture) runs here eagerly,
as ``enforce_eager`` runs it on a GPU: batched in padded buckets it equals the same runs alone
within float32 rounding, and one row at a time (``batch_invariant``) bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from omni_backend.engine import SamplingParams
from omni_backend.engine.sequence import SamplingParamsError
from omni_backend.models.voxcpm2.generate import generate_latents
from omni_backend.models.voxcpm2.model import load_model
from omni_backend.models.voxcpm2.prompt import build_prompt, max_patches
from omni_backend.models.voxcpm2.runner import VoxCPM2Params, create_engine
from omni_backend.models.voxcpm2.tokenizer import TextTokenizer
from tests.voxcpm2_fixtures import LATENT_ATOL

TEXTS = ["Hello the world.", "你好世界，今天天气很好。", "This is speech, a longer one with words.", "Short."]


@pytest.fixture(scope="module")
def tiny2(voxcpm2_checkpoints):
    path = str(voxcpm2_checkpoints["tiny2"])
    model, _ = load_model(path, dtype=torch.float32)
    return model, TextTokenizer(path)


def _requests(model, tokenize):
    out = []
    for i, text in enumerate(TEXTS * 2):
        prompt = build_prompt(tokenize, text, model.patch_size, model.feat_dim)
        extra = VoxCPM2Params(cfg_value=(2.0, 1.5)[i % 2], inference_timesteps=(4, 6)[i % 2], min_len=2 + i)
        out.append((f"r{i}", prompt, SamplingParams(max_new_tokens=max_patches(prompt, 16), min_new_tokens=0, seed=i,
                                                   extra=extra)))
    return out


@pytest.mark.slow   # a served batch against solo runs, every mode: not the edit-test loop
@pytest.mark.parametrize("batch_invariant,static_step", [(True, False), (False, False), (True, True),
                                                         (False, True)])
def test_served_together_equals_alone(tiny2, batch_invariant, static_step):
    model, tokenize = tiny2
    requests = _requests(model, tokenize)
    # buckets 1, 2, 4, 8: as requests stop, the groups (one per timestep count) shrink to padded buckets
    engine = create_engine(model, max_num_seqs=8, max_model_len=model.config.max_length,
                           batch_invariant=batch_invariant, static_step=static_step, cuda_graph_sizes=(1, 2, 4))
    assert (engine.runner.static is not None) == static_step
    padded = []
    if static_step:   # record each run's rows and bucket: padded buckets must occur
        graphs, run = engine.runner.graphs, engine.runner.graphs.run
        graphs.run = lambda rows, *variant: padded.append((rows, run(rows, *variant))) or padded[-1][1]
    frames = engine.generate(requests)
    if static_step and not batch_invariant:
        assert any(size > rows for rows, size in padded), padded
    lengths = []
    for rid, prompt, params in requests:
        e = params.extra
        alone = generate_latents(model, prompt, seed=params.seed, min_len=e.min_len, max_len=16,
                                 inference_timesteps=e.inference_timesteps, cfg_value=e.cfg_value).patches.numpy()
        got = np.asarray(frames[rid], dtype=np.float32)
        assert got.shape == (alone.shape[0], alone.shape[1] * alone.shape[2]), rid
        got = got.reshape(alone.shape)
        if batch_invariant:
            np.testing.assert_array_equal(got, alone, err_msg=rid)
        else:
            np.testing.assert_allclose(got, alone, atol=LATENT_ATOL, rtol=0, err_msg=rid)
        lengths.append(alone.shape[0])
    assert len(set(lengths)) > 1, lengths      # the stop head ends some, the bound others


@pytest.mark.parametrize("extra,field", [(VoxCPM2Params(cfg_value=11.0), "cfg_value"),
                                         (VoxCPM2Params(inference_timesteps=0), "inference_timesteps"),
                                         (VoxCPM2Params(min_len=-1), "min_len")])
def test_bad_knobs_name_their_field(tiny2, extra, field):
    model, tokenize = tiny2
    engine = create_engine(model, max_num_seqs=2, max_model_len=256, batch_invariant=True)
    prompt = build_prompt(tokenize, "Hello.", model.patch_size, model.feat_dim)
    with pytest.raises(SamplingParamsError) as e:
        engine.add_request("bad", prompt, SamplingParams(max_new_tokens=5, min_new_tokens=0, extra=extra))
    assert e.value.field == field
