"""vLLM-Omni's `sampling_params_list` on a chat body -> the chat pipeline's own parameters.

vLLM-Omni's clients send one vLLM `SamplingParams` object per stage, in stage order: the thinker's,
the talker's, the code2wav's (its clients always send all three). Here the thinker's become the
thinker's sampling fields (`temperature`, `top_p`, `top_k`, `max_tokens`, `repetition_penalty`,
`seed`), the talker's the `talker_*` ones, when the request asks for audio. `stop_token_ids` may
name only the model's own stop tokens (the catalog's `stop_token_ids`: every answer stops there
anyway), `detokenize` only what the stage does (the thinker's text is returned, the talker's codes
are not). A stage the request does not run (the talker and code2wav of a text answer; code2wav
always: it draws no samples) has its entry checked and not used, as in vLLM-Omni. Anything else is
a 400 naming `sampling_params_list[i].<key>`.
"""
from __future__ import annotations

from typing import Any, Callable

from client.speech_api.errors import invalid_request

__all__ = ["apply_stage_sampling"]

FIELD = "sampling_params_list"
STAGES = ("thinker", "talker", "code2wav")
KEYS = ("temperature", "top_p", "top_k", "max_tokens", "repetition_penalty", "seed", "stop_token_ids", "detokenize")
# vLLM key -> the pipeline parameter, per sampled stage ("seed" is one for both models)
NAMES = {
    "thinker": {"top_p": "top_p", "top_k": "top_k", "max_tokens": "max_tokens",
                "repetition_penalty": "repetition_penalty", "seed": "seed"},
    "talker": {"top_p": "talker_top_p", "top_k": "talker_top_k", "max_tokens": "talker_max_new_tokens",
               "repetition_penalty": "talker_repetition_penalty", "seed": "seed"},
}
TEMPERATURE = {"thinker": ("do_sample", "temperature"), "talker": ("talker_do_sample", "talker_temperature")}
DETOKENIZED = {"thinker": True, "talker": False}   # what the stage returns: text, or codes


def _number(value: Any, at: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid_request(at, f"{at}: must be a number")
    return value


def apply_stage_sampling(value: Any, stop_token_ids: dict[str, tuple[int, ...]], audio: bool,
                         given: dict[str, Any], put: Callable[[str, Any, str], None]) -> None:
    """Check ``value`` (the body's `sampling_params_list`) and ``put(param, value, field)`` what it
    sets; ``given`` holds the parameters set so far, which ``put`` adds to (a value set two ways
    must agree)."""
    if not isinstance(value, list) or not 1 <= len(value) <= len(STAGES):
        raise invalid_request(FIELD, f"{FIELD}: must be a list of up to {len(STAGES)} objects, one per stage "
                                     f"({', '.join(STAGES)})")
    for i, entry in enumerate(value):
        stage, at = STAGES[i], f"{FIELD}[{i}]"
        if not isinstance(entry, dict):
            raise invalid_request(at, f"{at}: must be an object of sampling parameters (the {stage}'s)")
        for key, v in entry.items():
            where = f"{at}.{key}"
            if key not in KEYS:
                raise invalid_request(at, f"{at}: {key!r} is not supported; the {stage}'s entry takes "
                                          f"{', '.join(KEYS)}", code="unsupported_parameter")
            if key == "stop_token_ids":
                own = stop_token_ids.get(stage, ())
                if not isinstance(v, list) or any(isinstance(t, bool) or not isinstance(t, int) or t not in own
                                                  for t in v):
                    raise invalid_request(where, f"{where}: only the {stage}'s own stop tokens "
                                                 f"({list(own)}) are supported")
            elif key == "detokenize":
                if stage in DETOKENIZED and v is not DETOKENIZED[stage]:
                    raise invalid_request(where, f"{where}: the {stage} returns "
                                                 f"{'text' if DETOKENIZED[stage] else 'codes'}: only "
                                                 f"{str(DETOKENIZED[stage]).lower()}")
                if not isinstance(v, bool):
                    raise invalid_request(where, f"{where}: must be true or false")
            elif key == "seed" and v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise invalid_request(where, f"{where}: must be an integer")
            elif v is not None and _number(v, where) < 0 and key == "temperature":
                raise invalid_request(where, f"{where}: must be >= 0 (0: greedy)")
        if stage not in NAMES or (stage == "talker" and not audio):
            continue   # a stage this request does not run, or code2wav: nothing to sample
        for key, v in entry.items():
            where = f"{at}.{key}"
            if v is None or key in ("stop_token_ids", "detokenize"):
                continue
            if key == "temperature":
                sample, temperature = TEMPERATURE[stage]
                _set(put, given, sample, v > 0, where)
                if v > 0:
                    _set(put, given, temperature, v, where)
            elif key == "top_k":
                _set(put, given, NAMES[stage][key], 0 if v == -1 else v, where)   # vLLM's -1: off
            else:
                _set(put, given, NAMES[stage][key], v, where)


def _set(put: Callable[[str, Any, str], None], given: dict[str, Any], name: str, value: Any, where: str) -> None:
    if name in given and given[name] != value:
        raise invalid_request(where, f"{where}: {value!r} differs from the {name} this request already sets "
                                     f"({given[name]!r})")
    put(name, value, where)
