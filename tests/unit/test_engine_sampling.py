"""Sampling: a seed reproduces a request's codes, alone or batched with other sampled requests;
the logits processors follow transformers' generate()."""
from __future__ import annotations

import math

import pytest
import torch

from omni_backend.engine import SamplingParams
from omni_backend.engine.sampling import TokenRules, apply_repetition_penalty, select, warp
from omni_backend.models.qwen3_tts.runner import create_engine


pytestmark = pytest.mark.usefixtures("qwen3_threads")


def test_seeded_sampling_is_reproducible(qwen3_loaded, qwen3_tiny_cv):
    ck = qwen3_loaded(qwen3_tiny_cv)
    builder = ck.prompt_builder()
    prompt = builder.build("Hello world, this is a streaming test.", speaker="ryan", language="english")
    other = builder.build("你好，世界。", speaker="eric", language="chinese")
    params = SamplingParams(seed=1234, max_new_tokens=10)
    engine = create_engine(ck, max_num_seqs=4, max_model_len=128, num_threads=1)
    first = engine.generate([("a", prompt, params)])["a"]
    second = engine.generate([("a", prompt, params)])["a"]
    assert first == second and len(first) == 9
    mixed = engine.generate([("x", other, SamplingParams(seed=7, max_new_tokens=12)), ("a", prompt, params),
                             ("y", other, SamplingParams(seed=8, max_new_tokens=6, temperature=1.3, top_k=5,
                                                         top_p=0.8))])
    assert mixed["a"] == first
    different = engine.generate([("a", prompt, SamplingParams(seed=4321, max_new_tokens=10))])["a"]
    assert different != first
    greedy = engine.generate([("g", prompt, SamplingParams.greedy(max_new_tokens=10))])["g"]
    assert greedy != first


def test_repetition_penalty_matches_transformers_formula():
    scores = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    out = apply_repetition_penalty(scores, [0, 1, 1], 2.0)
    assert out.tolist() == [[1.0, -2.0, 0.5, 3.0]]


def test_token_rules():
    rules = TokenRules(8, eos_ids=[5, 3], suppressed=[4, 6, 7])
    scores = torch.zeros(1, 8)
    held = rules.apply(scores, [1], 1.0, ban_eos=True)   # the engine bans eos before min_new_tokens
    assert held[0, 5] == held[0, 3] == -math.inf and held[0, 4] == -math.inf and held[0, 0] == 0
    free = rules.apply(scores, [1, 2], 1.0, ban_eos=False)
    assert free[0, 5] == free[0, 3] == 0 and free[0, 7] == -math.inf


def test_warpers():
    scores = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    top2 = warp(scores, 1.0, 2, 1.0)
    assert torch.isinf(top2[0, :2]).all() and top2[0, 2:].tolist() == [3.0, 4.0]
    nucleus = warp(torch.log(torch.tensor([[0.05, 0.15, 0.3, 0.5]])), 1.0, 0, 0.7)
    assert torch.isinf(nucleus[0, :2]).all() and torch.isfinite(nucleus[0, 2:]).all()
    assert warp(scores, 0.5, 0, 1.0).tolist() == [[2.0, 4.0, 6.0, 8.0]]
    g = torch.Generator().manual_seed(0)
    picks = {select(scores, True, 1.0, 1, 1.0, g) for _ in range(20)}
    assert picks == {3}
    assert select(scores, False, 1.0, 0, 1.0, None) == 3
