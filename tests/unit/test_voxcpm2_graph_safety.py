"""VoxCPM2's per-step work (the side module's fixed-step solver, the stop head, the feedback
through the local encoder, backbone and residual LM) reads no device value on the host: run on
the **meta** device (shapes, no values), where an ``.item()``, a ``bool(tensor)``, a
data-dependent shape or a stray CPU tensor raises, at a released-scale shape in bfloat16. What
needs the host (each request's noise draw, the stop decision's ``tolist``) stays outside, in the
runner."""
from __future__ import annotations

import pytest
import torch

from omni_backend.models.voxcpm2.config import parse_config
from omni_backend.models.voxcpm2.minicpm import StaticKVCache
from omni_backend.models.voxcpm2.model import StepState, VoxCPM2
from omni_backend.models.voxcpm2.random_checkpoint import released_scale_config

META = torch.device("meta")


def _released_scale() -> dict:
    return released_scale_config()


def test_meta_device_rejects_host_reads():
    x = torch.zeros(4, device=META)
    with pytest.raises(Exception):
        x.sum().item()
    with pytest.raises(Exception):
        x[x > 0]


@pytest.mark.parametrize("rows,timesteps", [(1, 10), (4, 10), (3, 4)])
def test_step_has_no_host_sync(rows, timesteps):
    config = parse_config(_released_scale())
    with META:
        model = VoxCPM2(config).to(torch.bfloat16)
        lm_cache = StaticKVCache(config.lm_config, 8, 256, META, torch.bfloat16)
        res_cache = StaticKVCache(config.residual_lm(), 8, 256, META, torch.bfloat16)
        h, p, d = config.lm_config.hidden_size, config.patch_size, config.feat_dim
        state = StepState(torch.empty(rows, h, dtype=torch.bfloat16), torch.empty(rows, h, dtype=torch.bfloat16),
                          torch.empty(rows, p, d, dtype=torch.bfloat16))
        noise = torch.empty(rows, d, p, dtype=torch.bfloat16)
        cfg = torch.empty(rows)
        positions = torch.arange(rows) + 17
        slots = torch.arange(rows)
    patch = model.side_module(state, noise, timesteps, cfg)
    stop = model.stop_logits(state.lm_hidden).argmax(dim=-1)
    nxt = model.advance(patch, positions, slots, lm_cache, res_cache)
    assert patch.device == META and patch.shape == (rows, p, d)
    assert stop.shape == (rows,)
    assert nxt.lm_hidden.shape == (rows, h) and nxt.residual_hidden.shape == (rows, h)


@pytest.mark.parametrize("batch,rows,timesteps", [(1, 1, 10), (3, 4, 10), (8, 8, 4)])
def test_static_step_has_no_host_sync(batch, rows, timesteps):
    """The runner's CUDA-graph step itself (what ``GraphBuckets`` captures), padding rows included:
    ``batch`` requests in a bucket of ``rows``, over static buffers, on the meta device."""
    from omni_backend.models.voxcpm2.static_step import StaticStep

    config = parse_config(_released_scale())
    with META:
        model = VoxCPM2(config).to(torch.bfloat16)
        lm_cache = StaticKVCache(config.lm_config, 9, 256, META, torch.bfloat16)
        res_cache = StaticKVCache(config.residual_lm(), 9, 256, META, torch.bfloat16)
        h, p, d = config.lm_config.hidden_size, config.patch_size, config.feat_dim
        static = StaticStep(model, lm_cache, res_cache, rows=8, scratch_slot=8)
        state = StepState(torch.empty(batch, h, dtype=torch.bfloat16), torch.empty(batch, h, dtype=torch.bfloat16),
                          torch.empty(batch, p, d, dtype=torch.bfloat16))
        static.load(state, torch.empty(batch, d, p, dtype=torch.bfloat16), torch.empty(batch),
                    torch.arange(batch) + 17, torch.arange(batch), rows)
    static.run(rows, timesteps)
    assert static.patches.device == META and static.patches.shape == (8, p, d)
    assert static.stop.shape == (8,) and static.lm_hidden.shape == (8, h)
