"""`session.config` of `WS /v1/audio/speech/stream`: vLLM-Omni's fields, checked like a speech body.

The speech fields (`model`, `voice` or `speaker`, `response_format`, `speed`, `instructions`,
`task_type`, `language`, `seed`, `max_new_tokens`, `initial_codec_chunk_frames`, `ref_audio`,
`ref_text`, `x_vector_only_mode`) go through the same checks as `POST /v1/audio/speech`
(request.py) against the pipeline they name. Session fields: `split_granularity` (`none` |
`sentence` | `clause` | `append`; `append` only for pipelines that read text as it arrives), or
vLLM-Omni's `streaming_mode` (`token_level` | `sentence_commit`: `append` where the pipeline reads
text as it arrives, else `sentence`),
`sample_rate` (of the audio sent), `stream_audio` (accepted; audio is always streamed), sampling
(`do_sample`, `temperature`, `top_k`, `top_p`, `repetition_penalty` at the top level; in a
`sampling` object also any other sampling parameter the pipeline declares, e.g. a second
sampler's), `audio_transport` (`binary` frames, or `json`: `audio.chunk` messages with
`audio_b64`). `word_timestamps: true` is refused (no aligner).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from client.speech_api.errors import ApiError, invalid_request
from client.speech_api.field_checks import check_param
from client.speech_api.request import RESPONSE_FORMATS, TritonRequest, build_triton_params, parse_speech_body
from client.speech_api.text_splitter import GRANULARITIES
from omni_backend.adapters.base import shown

SPLITS = GRANULARITIES + ("append",)
SAMPLING_FIELDS = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty")
PASSED_FIELDS = SAMPLING_FIELDS + ("non_streaming_mode",)   # to pipelines that accept them
TRANSPORTS = ("binary", "json")
# Request fields with a meaning of their own: never taken from `sampling`.
NOT_SAMPLING = ("voice", "speaker", "speed", "instructions", "ref_audio", "ref_text", "x_vector_only_mode",
                "speaker_embedding", "streaming_input", "task_type", "language", "model")
SESSION_FIELDS = ("type", "split_granularity", "streaming_mode", "sample_rate", "stream_audio", "word_timestamps",
                  "audio_transport", "sampling", "speaker") + PASSED_FIELDS
# vLLM-Omni's newer clients name the text's flow instead: both feed one request as text arrives
# (`append`), or, for a pipeline that cannot take text that way, speak each sentence once complete
STREAMING_MODES = ("token_level", "sentence_commit")
STREAMING_INPUT = "streaming_input"   # the pipeline parameter behind split_granularity=append
SAMPLE_RATES = (8000, 192000)


@dataclass
class SessionConfig:
    model: str
    request: TritonRequest          # pipeline, PARAMS (text filled per unit), speed plan
    response_format: str
    split: str
    sample_rate: int | None         # None: the pipeline's own
    transport: str


def _bool(msg: dict, name: str, default: bool) -> bool:
    value = msg.get(name, default)
    if not isinstance(value, bool):
        raise invalid_request(name, f"{name}: must be true or false, got {shown(value)}")
    return value


def parse_session_config(msg: dict[str, Any], resolve, catalog, voices) -> SessionConfig:
    """`resolve(model) -> pipeline` raises the 404 / 503 ApiError; `catalog` and `voices` are the
    shim's. Raises ApiError (400) naming the field."""
    mode = msg.get("streaming_mode")
    if mode is not None:
        if mode not in STREAMING_MODES:
            raise invalid_request("streaming_mode", f"streaming_mode: unknown value {shown(mode)}; use one of "
                                                    f"{', '.join(STREAMING_MODES)} (or split_granularity)")
        if msg.get("split_granularity") is not None:
            raise invalid_request("streaming_mode", "streaming_mode: give it or split_granularity, not both")
    split = msg.get("split_granularity") or "none"
    if split not in SPLITS:
        raise invalid_request("split_granularity", f"split_granularity: unknown value {shown(split)}; "
                                                   f"use one of {', '.join(SPLITS)}")
    if _bool(msg, "word_timestamps", False):
        raise invalid_request("word_timestamps", "word_timestamps: not supported here (no forced aligner); "
                                                 "use audio_transport: json for audio.chunk messages",
                              code="unsupported_parameter")
    _bool(msg, "stream_audio", False)
    transport = msg.get("audio_transport", "binary")
    if transport not in TRANSPORTS:
        raise invalid_request("audio_transport", f"audio_transport: use one of {', '.join(TRANSPORTS)}")
    rate = msg.get("sample_rate")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int)
                             or not SAMPLE_RATES[0] <= rate <= SAMPLE_RATES[1]):
        raise invalid_request("sample_rate", f"sample_rate: must be an integer in [{SAMPLE_RATES[0]}, "
                                             f"{SAMPLE_RATES[1]}], got {shown(rate)}")
    sampling = msg.get("sampling") or {}
    if not isinstance(sampling, dict):
        raise invalid_request("sampling", "sampling: must be an object")
    for name in sampling:
        if name in NOT_SAMPLING:
            raise invalid_request("sampling", f"sampling: {shown(name)} is not a sampling parameter")
    sampling = {**{k: msg[k] for k in PASSED_FIELDS if msg.get(k) is not None}, **sampling}

    body = {k: v for k, v in msg.items() if k not in SESSION_FIELDS}
    if msg.get("speaker") is not None and "voice" not in body:
        body["voice"] = msg["speaker"]
    body.setdefault("response_format", "wav")
    body["input"] = "."   # the text comes later, unit by unit
    model = body.get("model")
    if model is None:
        body["model"] = model = catalog.default_model() or catalog.default_pipeline
    pipeline = resolve(model) if isinstance(model, str) and model.strip() else None
    if pipeline is not None:
        info = catalog.get(pipeline)
        if body.get("voice") is None:
            body["voice"] = info.default_voice or "alloy"   # a stock name: the model's own default
    elif body.get("voice") is None:
        body["voice"] = "alloy"
    speech = parse_speech_body(body)
    if speech.response_format not in RESPONSE_FORMATS:
        raise invalid_request("response_format", "response_format: unknown")
    if pipeline is None:
        pipeline = resolve(speech.model)
        info = catalog.get(pipeline)
    request = build_triton_params(speech, info, voices)
    for name, value in sampling.items():
        if not info.accepts(name):
            raise invalid_request(name, f"{name}: not supported by model '{info.name}'", code="unsupported_parameter")
        request.params[name] = check_param(info, name, value)
    if mode is not None:
        split = "append" if info.known and info.accepts(STREAMING_INPUT) else "sentence"
    if split == "append":
        if not (info.known and info.accepts(STREAMING_INPUT)):
            raise invalid_request("split_granularity", f"split_granularity: append needs a model that reads text "
                                                       f"as it arrives; '{info.name}' does not (use sentence or clause)",
                                  code="unsupported_parameter")
        if request.params.get("non_streaming_mode"):
            raise invalid_request("non_streaming_mode", "non_streaming_mode: append reads text as it arrives")
    return SessionConfig(model=speech.model, request=request, response_format=speech.response_format,
                         split=split, sample_rate=rate, transport=transport)


def merged_config(earlier: dict[str, Any], msg: dict[str, Any]) -> dict[str, Any]:
    """A later `session.config` changes the fields it names; the others keep their values (null
    sets one back to its default). `voice` and `speaker` are one field: naming either replaces both."""
    if "voice" in msg or "speaker" in msg:
        earlier = {k: v for k, v in earlier.items() if k not in ("voice", "speaker")}
    return {**earlier, **msg}


def error_message(error: ApiError) -> dict[str, Any]:
    """An ApiError as the session's `error` message: `message` starts with our stable code."""
    code = {400: "invalid_request", 404: "invalid_request", 413: "invalid_request",
            429: "unavailable", 503: "unavailable"}.get(error.status, "internal")
    message = error.message
    if not message.startswith(f"{code}:"):
        message = f"{code}: {error.param + ': ' if error.param and not message.startswith(error.param) else ''}{message}"
    return {"type": "error", "message": message, "code": code, "param": error.param, "status": error.status}
