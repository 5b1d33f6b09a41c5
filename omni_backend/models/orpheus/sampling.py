"""Orpheus's sampling defaults and a request's parameters over them (both engines).

Defaults, later ones winning: the released server's (``generate_tokens_sync``: temperature 0.6,
top_p 0.8, repetition penalty 1.3, 1200 tokens, no top-k), the checkpoint's
``generation_config.json``, the deploy's ``default_sampling_params``.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

from omni_backend.engine import SamplingParams

__all__ = ["default_params", "params_from_request", "stop_token_ids"]

RELEASED = SamplingParams(do_sample=True, temperature=0.6, top_k=0, top_p=0.8, repetition_penalty=1.3,
                          max_new_tokens=1200, min_new_tokens=0)
_GENERATION_KEYS = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty")
REQUEST_FIELDS = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "max_new_tokens")


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def default_params(model_path: str, deploy_defaults: Mapping[str, Any]) -> SamplingParams:
    generation = _read_json(os.path.join(model_path, "generation_config.json"))
    values = {k: generation[k] for k in _GENERATION_KEYS if generation.get(k) is not None}
    return dataclasses.replace(RELEASED, **values, **deploy_defaults).validate()


def stop_token_ids(model_path: str, end_of_speech: int) -> frozenset[int]:
    """The checkpoint's eos ids (config.json and generation_config.json) and end of speech."""
    ids = {end_of_speech}
    for name in ("config.json", "generation_config.json"):
        eos = _read_json(os.path.join(model_path, name)).get("eos_token_id")
        if eos is not None:
            ids.update(eos if isinstance(eos, list) else [eos])
    return frozenset(int(i) for i in ids)


def params_from_request(defaults: SamplingParams, request: Mapping[str, Any]) -> SamplingParams:
    values = {k: request[k] for k in REQUEST_FIELDS if request.get(k) is not None}
    return dataclasses.replace(defaults, seed=request.get("seed"), **values).validate()
