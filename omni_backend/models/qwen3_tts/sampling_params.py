"""Qwen3-TTS's own sampling knobs: the code predictor's (codebooks 1..15 of each frame).

The engine's :class:`~omni_backend.engine.SamplingParams` drives codebook 0 (the talker's token,
the one checked for eos); :class:`Qwen3SamplingParams` rides in its ``extra`` field. Their names
are the reference's ``generate()`` keywords (``subtalker_*``), which are also the request's and the
deploy ``options``' keys.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from omni_backend.engine import SamplingParams, SamplingParamsError, check_warp

__all__ = ["Qwen3SamplingParams", "code_predictor_params", "sampling_params_from_request"]


@dataclass(frozen=True)
class Qwen3SamplingParams:
    """``subtalker_do_sample=None`` follows the request's ``do_sample``, so
    ``SamplingParams.greedy()`` is greedy for every codebook."""

    subtalker_do_sample: Optional[bool] = None
    subtalker_temperature: float = 0.9
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0

    def resolved(self, do_sample: bool) -> "Qwen3SamplingParams":
        if self.subtalker_do_sample is not None:
            return self
        return dataclasses.replace(self, subtalker_do_sample=bool(do_sample))


FIELDS = tuple(f.name for f in dataclasses.fields(Qwen3SamplingParams))


def code_predictor_params(params: SamplingParams) -> Qwen3SamplingParams:
    """The code predictor's parameters of a request (``params.extra``, or the defaults), checked,
    with ``subtalker_do_sample`` resolved. Raises :class:`SamplingParamsError`."""
    extra = Qwen3SamplingParams() if params.extra is None else params.extra
    if not isinstance(extra, Qwen3SamplingParams):
        raise SamplingParamsError("extra", f"expected Qwen3SamplingParams or None, got {type(extra).__name__}")
    cp = extra.resolved(params.do_sample)
    check_warp("subtalker_", cp.subtalker_do_sample, cp.subtalker_temperature, cp.subtalker_top_k,
               cp.subtalker_top_p)
    return cp


# What a request may set (the adapter's names); min_new_tokens is a deploy default only.
REQUEST_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams)
                       if f.name not in ("seed", "min_new_tokens", "extra"))


def sampling_params_from_request(defaults: SamplingParams, request: Mapping[str, Any]) -> SamplingParams:
    """A request's parameters over ``defaults`` (a key absent or ``None`` keeps the default): the
    engine's fields, the ``subtalker_*`` ones into ``extra``, ``seed`` (``None``: random), and
    ``ignore_eos`` (``min_new_tokens`` up to ``max_new_tokens``)."""
    values = {k: request[k] for k in REQUEST_FIELDS if request.get(k) is not None}
    if request.get("ignore_eos"):   # eos is held back for every token max_new_tokens allows
        values["min_new_tokens"] = values.get("max_new_tokens", defaults.max_new_tokens)
    cp = {k: request[k] for k in FIELDS if request.get(k) is not None}
    extra = defaults.extra if defaults.extra is not None else Qwen3SamplingParams()
    return dataclasses.replace(defaults, seed=request.get("seed"), extra=dataclasses.replace(extra, **cp), **values)
