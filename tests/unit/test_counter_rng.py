"""The in-step sampler's counter-based uniforms: exact splitmix64 bits, per-row independence of
the batch, and an exponential race that samples the softmax distribution."""
from __future__ import annotations

import torch

from omni_backend.engine.counter_rng import uniform

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(x: int) -> int:   # splitmix64's finaliser on Python ints (the specification)
    x &= _MASK
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _uniform(seed: int, counter: int, index: int) -> float:
    bits = _mix(_mix(seed * _GOLDEN + counter) + index * _GOLDEN)
    return ((bits >> 40) + 0.5) * 2.0 ** -24


def test_bits_equal_the_python_specification():
    seeds, counters = [0, 1, 2 ** 62 + 12345, 2 ** 63 - 1], [0, 7, 123456, 2 ** 40]
    index = torch.arange(0, 40000, 997)
    got = uniform(torch.tensor(seeds), torch.tensor(counters), index)
    want = torch.tensor([[_uniform(s, c, int(i)) for i in index] for s, c in zip(seeds, counters)])
    assert torch.equal(got, want)
    assert 0 < got.min() and got.max() < 1


def test_rows_depend_on_their_own_seed_and_counter_only():
    index = torch.arange(100)
    alone = uniform(torch.tensor([42]), torch.tensor([3]), index)
    batch = uniform(torch.tensor([7, 42, 42]), torch.tensor([3, 3, 4]), index)
    assert torch.equal(batch[1:2], alone)
    assert not torch.equal(batch[0:1], alone) and not torch.equal(batch[2:3], alone)


def test_moments_and_exponential_race_follow_the_distribution():
    u = uniform(torch.tensor([5]), torch.tensor([0]), torch.arange(1_000_000))
    assert abs(u.mean().item() - 0.5) < 2e-3 and abs(u.var().item() - 1 / 12) < 1e-3
    probs = torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03])
    draws = 40000   # one draw per frame counter of one request, as the static step makes them
    noise = -torch.log(uniform(torch.full((draws,), 11), torch.arange(draws), torch.arange(5)))
    picks = torch.argmax(probs / noise, dim=-1)
    freq = torch.bincount(picks, minlength=5).float() / draws
    assert torch.allclose(freq, probs, atol=0.01), freq
