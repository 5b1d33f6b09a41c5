"""Orpheus's sampling defaults and a request's parameters over them (both engines).

Defaults: the released package's (``generate_tokens_sync``: temperature 0.6, top_p 0.8, repetition
penalty 1.3, 1200 tokens, no top-k), then the deploy's ``default_sampling_params``. The package passes
its values explicitly, so a checkpoint's ``generation_config.json`` (a fine-tune's is often its base
Llama's: top_p 0.9) does not change how it samples, and here it does not either; only its eos ids
count (:func:`stop_token_ids`).
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
REQUEST_FIELDS = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "max_new_tokens")


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def default_params(deploy_defaults: Mapping[str, Any]) -> SamplingParams:
    return dataclasses.replace(RELEASED, **deploy_defaults).validate()


def stop_token_ids(model_path: str, end_of_speech: int) -> frozenset[int]:
    """The checkpoint's eos ids (config.json and generation_config.json) and end of speech."""
    ids = {end_of_speech}
    for name in ("config.json", "generation_config.json"):
        eos = _read_json(os.path.join(model_path, name)).get("eos_token_id")
        if eos is not None:
            ids.update(eos if isinstance(eos, list) else [eos])
    return frozenset(int(i) for i in ids)


def params_from_request(defaults: SamplingParams, request: Mapping[str, Any]) -> SamplingParams:
    """A request's sampling over ``defaults``; ``ignore_eos`` holds eos (and end of speech) back
    for every token ``max_new_tokens`` allows."""
    values = {k: request[k] for k in REQUEST_FIELDS if request.get(k) is not None}
    if request.get("ignore_eos"):
        values["min_new_tokens"] = values.get("max_new_tokens", defaults.max_new_tokens)
    return dataclasses.replace(defaults, seed=request.get("seed"), **values).validate()
