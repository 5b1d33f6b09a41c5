"""Orpheus's `ignore_eos` (vLLM-Omni's benchmark sends it to every model): eos and end of speech
are held back for every token `max_new_tokens` allows, on the torch engine."""
from __future__ import annotations

import torch

from omni_backend.engine import SamplingParams


def test_ignore_eos_runs_to_max_new_tokens(orpheus_checkpoints):
    from omni_backend.models.orpheus.runner import create_engine
    from omni_backend.models.orpheus.sampling import params_from_request
    from omni_backend.models.orpheus.tokens import OrpheusPrompt

    torch.set_num_threads(1)
    path = str(orpheus_checkpoints["tiny"])
    prompt = OrpheusPrompt(path)
    ids = prompt.ids("Hello there, a benchmark request.", "tara")
    defaults = SamplingParams.greedy(max_new_tokens=1200, min_new_tokens=0)
    free = create_engine(path, frozenset({prompt.tokens.end_of_speech}), max_num_seqs=2, max_model_len=256)
    tokens = [f[0] for f in free.generate([("free", ids, params_from_request(defaults, {"max_new_tokens": 40}))])["free"]]
    assert len(tokens) == 40
    # a stop id this checkpoint greedily says at its 6th token (not before): the engine stops there
    stop = next(t for i, t in enumerate(tokens) if i >= 5 and t not in tokens[:i])
    at = tokens.index(stop)
    engine = create_engine(path, frozenset({stop, prompt.tokens.end_of_speech}), max_num_seqs=2, max_model_len=256)
    got = engine.generate([
        ("honoured", ids, params_from_request(defaults, {"max_new_tokens": 40})),
        ("ignored", ids, params_from_request(defaults, {"max_new_tokens": 40, "ignore_eos": True})),
        ("off", ids, params_from_request(defaults, {"max_new_tokens": 40, "ignore_eos": False}))])
    honoured, ignored, off = ([f[0] for f in got[k]] for k in ("honoured", "ignored", "off"))
    assert honoured == off == tokens[:at]          # the stop id itself is no audio token
    assert len(ignored) == 40 and stop not in ignored and ignored[:at] == tokens[:at]
    assert params_from_request(defaults, {"ignore_eos": True}).min_new_tokens == 1200
