"""Building blocks: batch-invariant ops (rows equal the single-row computation, with a per-row
fallback where the batched op is not), the rotary tables and the static KV cache."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from omni_backend.engine.kv_cache import StaticKVCache
from omni_backend.models.qwen3_tts.exact_step import BatchInvariantOps
from omni_backend.models.qwen3_tts.rotary import CodePredictorRotary, TalkerRotary


@pytest.mark.parametrize("k, n, rows, bias", [(64, 3072, 1, False), (48, 24, 2, True), (136, 48, 1, False),
                                              (16, 16, 1, False), (512, 1536, 1, False), (96, 48, 2, True),
                                              (384, 2304, 2, True)])
def test_linear_rows_equal_single_row(k, n, rows, bias):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(n, k, generator=g) / math.sqrt(k)
    b = torch.randn(n, generator=g) if bias else None
    x = torch.randn(7, rows, k, generator=g)
    ops = BatchInvariantOps()
    out = ops.linear(x, weight, b)
    for i in range(7):
        assert torch.equal(out[i:i + 1], F.linear(x[i:i + 1], weight, b))
    assert torch.allclose(BatchInvariantOps(enabled=False).linear(x, weight, b), out, atol=1e-5)


@pytest.mark.parametrize("batch, rows", [(2, 1), (3, 1), (2, 2), (4, 1)])
@pytest.mark.parametrize("bias", [False, True])
def test_plain_linear_pads_few_rows_to_the_gemm_kernel(batch, rows, bias):
    """With batch invariance off, 2-3 rows go through MKL's 4-row kernel: same shape and values
    as ``F.linear`` (to rounding), and each row as computed among 4 rows."""
    g = torch.Generator().manual_seed(2)
    weight = torch.randn(96, 64, generator=g) / 8
    b = torch.randn(96, generator=g) if bias else None
    x = torch.randn(batch, rows, 64, generator=g)
    out = BatchInvariantOps(enabled=False).linear(x, weight, b)
    assert out.shape == (batch, rows, 96)
    assert torch.allclose(out, F.linear(x, weight, b), atol=1e-5)
    if batch * rows < BatchInvariantOps.MIN_GEMM_ROWS:
        block = torch.cat([x.reshape(-1, 64), torch.randn(4 - batch * rows, 64, generator=g)])
        assert torch.equal(out.reshape(-1, 96), F.linear(block, weight, b)[:batch * rows])


@pytest.mark.parametrize("width", [96, 128, 136, 100])
@pytest.mark.parametrize("positions", [1, 2])
def test_elementwise_rows_equal_single_row(width, positions):
    """Checked on many inputs at a large scale: where a row's tail falls into another row's vector
    body, plain batched ``silu`` differs from the row alone for many of them (asserted where a row
    is not a whole number of the kernel's steps, two SIMD vectors: 16 floats with AVX2, 32 with
    AVX-512, so the check can fail on either)."""
    g = torch.Generator().manual_seed(1)
    ops = BatchInvariantOps()
    plain_differs = 0
    for _ in range(50):
        x = torch.randn(3, positions, width, generator=g) * 4
        alone = torch.cat([F.silu(x[i:i + 1]) for i in range(3)])
        assert torch.equal(ops.elementwise("silu", F.silu, x), alone)
        plain_differs += not torch.equal(F.silu(x), alone)
    lanes = {"AVX2": 8, "AVX512": 16}.get(torch.backends.cpu.get_cpu_capability())
    if lanes and (positions * width) % (2 * lanes):
        assert plain_differs > 0


def test_rows_apart_keeps_rows_that_are_already_apart():
    fused = torch.randn(4, 1, 2 * 136)
    gate = fused[..., :136]
    assert BatchInvariantOps.rows_apart(gate) is gate
    x = torch.randn(4, 2, 136)
    apart = BatchInvariantOps.rows_apart(x)
    assert torch.equal(apart, x) and apart.stride(0) > 2 * 136 and apart[0].is_contiguous()


def test_rotary_tables_are_rope():
    rotary = TalkerRotary(1e6, 16, (4, 2, 2), True, torch.float32, torch.device("cpu"))
    positions = torch.tensor([0, 5, 130, 7])
    cos, sin = rotary.decode(positions)
    inv = 1.0 / (1e6 ** (torch.arange(0, 16, 2).float() / 16))
    for row, p in enumerate(positions.tolist()):
        angles = torch.cat([p * inv, p * inv])
        assert torch.allclose(cos[row, 0, 0], angles.cos(), atol=1e-6)
        assert torch.allclose(sin[row, 0, 0], angles.sin(), atol=1e-6)
    prefill_cos, _ = rotary.prefill(10)
    assert prefill_cos.shape == (1, 1, 10, 16)
    assert torch.allclose(prefill_cos[0, 0, 5], cos[1, 0, 0], atol=1e-6)
    cp = CodePredictorRotary(1e6, 12, 15, torch.float32, torch.device("cpu"))
    assert cp.prefill_table[0].shape == (1, 1, 2, 12) and sorted(cp.tables) == list(range(2, 16))


def test_static_kv_cache_rows():
    cache = StaticKVCache(1, 3, 2, 8, 4)
    k = torch.randn(1, 2, 5, 4)
    cache.write_prefix(0, 1, k, k + 1)
    keys, values = cache.view(0, 1, 5)
    assert torch.equal(keys, k) and torch.equal(values, k + 1)
    new = torch.randn(2, 2, 1, 4)
    cache.write_rows(0, torch.tensor([1, 2]), torch.tensor([5, 0]), new, new)
    assert torch.equal(cache.view(0, 1, 6)[0][0, :, 5], new[0, :, 0])
    assert torch.equal(cache.view(0, 2, 1)[0][0, :, 0], new[1, :, 0])
    assert cache.nbytes == 2 * 3 * 2 * 8 * 4 * 4
