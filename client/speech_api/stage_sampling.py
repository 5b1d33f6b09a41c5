"""vLLM-Omni's `sampling_params_list` on a chat body -> the chat pipeline's own parameters.

vLLM-Omni's clients send one vLLM `SamplingParams` object per stage, in stage order. What each
entry may set comes from the pipeline's catalog (`stage_sampling`, written by its adapter): per
stage, its name, the request field each vLLM key sets (`fields`; `temperature` 0 sets the
`do_sample` field false, vLLM's `top_k` -1 is 0, off), its own stop tokens (`stop_token_ids` may
name only those: every answer stops there anyway), what it returns (`detokenize` may only say
that), and whether only a request that asks for audio runs it (`audio_only`). The entry of a stage
the request does not run, or of one that samples nothing (no `fields`), is checked and not used,
as in vLLM-Omni. Anything else is a 400 naming `sampling_params_list[i].<key>`.
"""
from __future__ import annotations

from typing import Any, Callable

from client.speech_api.errors import invalid_request

__all__ = ["FIELD", "apply_stage_sampling"]

FIELD = "sampling_params_list"
KEYS = ("temperature", "top_p", "top_k", "max_tokens", "repetition_penalty", "seed", "stop_token_ids", "detokenize")
CHECKED_ONLY = ("stop_token_ids", "detokenize")   # conditions of what the stage does anyway


def apply_stage_sampling(value: Any, stages: tuple[dict, ...], audio: bool, given: dict[str, Any],
                         put: Callable[[str, Any, str], None]) -> None:
    """Check ``value`` (the body's `sampling_params_list`) against the catalog's ``stages`` and
    ``put(param, value, field)`` what it sets; ``given`` holds the parameters set so far, which
    ``put`` adds to (a value set two ways must agree)."""
    if not stages:
        raise invalid_request(FIELD, f"{FIELD}: this model takes no per-stage sampling", code="unknown_parameter")
    names = ", ".join(str(s.get("stage")) for s in stages)
    if not isinstance(value, list) or not 1 <= len(value) <= len(stages):
        raise invalid_request(FIELD, f"{FIELD}: must be a list of up to {len(stages)} objects, one per stage ({names})")
    for i, (entry, stage) in enumerate(zip(value, stages)):
        at = f"{FIELD}[{i}]"
        if not isinstance(entry, dict):
            raise invalid_request(at, f"{at}: must be an object of sampling parameters (the {stage['stage']}'s)")
        for key, v in entry.items():
            _check(stage, f"{at}.{key}", key, v, at)
        fields = stage.get("fields") or {}
        if not fields or (stage.get("audio_only") and not audio):
            continue   # a stage that samples nothing, or that this request does not run
        for key, v in entry.items():
            if v is None or key in CHECKED_ONLY:
                continue
            where = f"{at}.{key}"
            if key == "temperature":
                _set(put, given, fields["do_sample"], v > 0, where)
                if v > 0:
                    _set(put, given, fields["temperature"], v, where)
            else:
                _set(put, given, fields[key], 0 if key == "top_k" and v == -1 else v, where)


def _check(stage: dict, where: str, key: str, v: Any, at: str) -> None:
    if key not in KEYS:
        raise invalid_request(at, f"{at}: {key!r} is not supported; the {stage['stage']}'s entry takes "
                                  f"{', '.join(KEYS)}", code="unsupported_parameter")
    if key == "stop_token_ids":
        own = list(stage.get("stop_token_ids") or ())
        if not isinstance(v, list) or any(isinstance(t, bool) or not isinstance(t, int) or t not in own for t in v):
            raise invalid_request(where, f"{where}: only the {stage['stage']}'s own stop tokens ({own}) are supported")
    elif key == "detokenize":
        if not isinstance(v, bool):
            raise invalid_request(where, f"{where}: must be true or false")
        if "detokenize" in stage and v is not stage["detokenize"]:
            raise invalid_request(where, f"{where}: the {stage['stage']} returns "
                                         f"{'text' if stage['detokenize'] else 'no text'}: only "
                                         f"{str(stage['detokenize']).lower()}")
    elif v is None:
        return
    elif key == "seed":
        if isinstance(v, bool) or not isinstance(v, int):
            raise invalid_request(where, f"{where}: must be an integer")
    elif isinstance(v, bool) or not isinstance(v, (int, float)):
        raise invalid_request(where, f"{where}: must be a number")
    elif key == "temperature" and v < 0:
        raise invalid_request(where, f"{where}: must be >= 0 (0: greedy)")


def _set(put: Callable[[str, Any, str], None], given: dict[str, Any], name: str, value: Any, where: str) -> None:
    if name in given and given[name] != value:
        raise invalid_request(where, f"{where}: {value!r} differs from the {name} this request already sets "
                                     f"({given[name]!r})")
    put(name, value, where)
