"""The body of `POST /v1/audio/speech`: OpenAI's fields, our extensions, the model's own
parameters (any other key its catalog lists, e.g. a guidance scale), and their checks.

Validation happens in two steps. `parse_speech_body` checks the shape every request must have
(types, ranges, known field names) without knowing the model. `build_triton_params` then checks
the request against the pipeline it resolved to (which extensions it accepts, its voices, how
speed is realised) and produces the PARAMS object for Triton. Every problem is an `ApiError` 400
naming the field; strings follow the entry model's rule (no unpaired surrogates, no NUL), so a
body that would fail inside Triton, or not even encode for it, is a 400 here.
"""
from __future__ import annotations

import base64
import binascii
import math
from dataclasses import dataclass, field
from typing import Any

from client.speech_api.catalog import CLONE_FIELDS, OPENAI_VOICES, PipelineInfo
from client.speech_api.errors import ApiError, invalid_request
from client.speech_api.field_checks import FIELD_NAME, check_param, clean_string
from client.speech_api.speed import SpeedPlan, plan_speed
from omni_backend.adapters.base import shown

MAX_INPUT_CHARS = 4096
MAX_INSTRUCTIONS_CHARS = 4096
RESPONSE_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
STREAM_FORMATS = ("audio", "sse")
SPEED_RANGE = (0.25, 4.0)
OPENAI_FIELDS = ("model", "input", "voice", "instructions", "response_format", "speed", "stream_format")
# Fields of vLLM-Omni's speech API handled by the shim itself: `stream` (true: streamed, the
# default; false: the whole file in one response with its length), `speaker` (its other name of
# `voice`).
SHIM_FIELDS = ("stream", "speaker")
# Extensions shared with vLLM-Omni's speech API; passed to pipelines whose adapter accepts them.
# `ignore_eos` (its benchmark sends it): generate up to `max_new_tokens`; false is every
# pipeline's own behaviour, so it is only passed on where the pipeline accepts the field.
EXTENSION_FIELDS = ("task_type", "language", "seed", "max_new_tokens", "initial_codec_chunk_frames",
                    "ref_audio", "ref_text", "x_vector_only_mode", "speaker_embedding", "ignore_eos")
MAX_REF_AUDIO_CHARS = 16 * 1024 * 1024
MAX_EMBEDDING = 4096   # numbers in a speaker embedding (vLLM-Omni's limit)
# An extension may have another name in a pipeline's adapter; the first name it accepts is used.
EXTENSION_PARAM_NAMES = {"initial_codec_chunk_frames": ("initial_codec_chunk_frames", "initial_chunk_frames"),
                         # a model that counts its steps in patches calls the step limit max_len
                         "max_new_tokens": ("max_new_tokens", "max_len")}


@dataclass
class SpeechRequest:
    model: str | None    # None: the server's default model
    input: str
    voice: str | None   # None: the model's default voice (vLLM-Omni's clients send none)
    response_format: str = "mp3"
    speed: float = 1.0
    stream_format: str = "audio"
    stream: bool = True
    instructions: str | None = None
    extensions: dict[str, Any] = field(default_factory=dict)
    # other keys: parameters of the model's own (its catalog, GET /v1/models/{model}), checked
    # once the model is known
    model_params: dict[str, Any] = field(default_factory=dict)


def _optional(body: dict, name: str) -> Any:
    value = body.get(name)
    return None if value is None else value


def _string(body: dict, name: str, *, required: bool = False, max_len: int | None = None) -> str | None:
    value = _optional(body, name)
    if value is None:
        if required:
            raise invalid_request(name, f"{name}: is required", code="missing_required_parameter")
        return None
    if not isinstance(value, str):
        raise invalid_request(name, f"{name}: must be a string, got {type(value).__name__}")
    if max_len is not None and len(value) > max_len:
        raise invalid_request(name, f"{name}: is {len(value)} characters; the limit is {max_len}",
                              code="string_above_max_length")
    return clean_string(name, value)


def _integer(body: dict, name: str, lo: int, hi: int | None = None) -> int | None:
    value = _optional(body, name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise invalid_request(name, f"{name}: must be an integer, got {shown(value)}")
    if value < lo or (hi is not None and value > hi):
        bound = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise invalid_request(name, f"{name}: must be {bound}, got {shown(value)}")
    return value


def _choice(body: dict, name: str, choices: tuple[str, ...], default: str) -> str:
    value = _string(body, name)
    if value is None:
        return default
    if value not in choices:
        raise invalid_request(name, f"{name}: unknown value {shown(value)}; use one of {', '.join(choices)}")
    return value


def _boolean(body: dict, name: str) -> bool | None:
    value = _optional(body, name)
    if value is not None and not isinstance(value, bool):
        raise invalid_request(name, f"{name}: must be true or false, got {shown(value)}")
    return value


def _voice(body: dict) -> str | None:
    if body.get("speaker") is not None:   # vLLM-Omni's other name for it
        if body.get("voice") is not None and body["voice"] != body["speaker"]:
            raise invalid_request("speaker", "speaker: another name for voice; give one of them")
        body = {**body, "voice": body["speaker"]}
    value = _optional(body, "voice")
    if isinstance(value, dict):  # OpenAI's custom-voice form {"id": "..."}
        unknown = set(value) - {"id"}
        if unknown:
            names = ", ".join(shown(k) for k in sorted(unknown))
            raise invalid_request("voice", f"voice: unknown key(s) {names}; use {{\"id\": ...}}")
        value = value.get("id")
        if not isinstance(value, str):
            raise invalid_request("voice", "voice: {\"id\": ...} must hold a string")
    elif value is None:
        return None
    elif not isinstance(value, str):
        raise invalid_request("voice", f"voice: must be a string or {{\"id\": ...}}, got {type(value).__name__}")
    if not value.strip():
        raise invalid_request("voice", "voice: is empty")
    return clean_string("voice", value.strip())


def _speed(body: dict) -> float:
    value = _optional(body, "speed")
    if value is None:
        return 1.0
    # isfinite() only for floats: it overflows on a 400-digit integer; comparisons do not.
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or (isinstance(value, float) and not math.isfinite(value))):
        raise invalid_request("speed", f"speed: must be a number, got {shown(value)}")
    lo, hi = SPEED_RANGE
    if not lo <= value <= hi:
        raise invalid_request("speed", f"speed: must be in [{lo}, {hi}], got {shown(value)}")
    return float(value)


def _ref_audio(value: str) -> str:
    """A data URL (`data:audio/wav;base64,...`) or bare base64 (vLLM-Omni's clients send either; it
    becomes a data URL). An http(s) URL was fetched before, where the operator allows it
    (media_fetch.fetch_ref_audio); file paths are never read."""
    if len(value) > MAX_REF_AUDIO_CHARS:
        raise invalid_request("ref_audio", f"ref_audio: larger than {MAX_REF_AUDIO_CHARS} characters")
    if not value.startswith("data:"):
        if ":" in value[:12]:   # a scheme (file:, ftp:, ...): base64 has no colon
            raise invalid_request("ref_audio", "ref_audio: must be a data URL like data:audio/wav;base64,..., "
                                               "base64 audio, or an http(s) URL where this server fetches")
        value = "data:application/octet-stream;base64," + "".join(value.split())
    head, sep, payload = value.partition(",")
    if not (sep and head.endswith(";base64")):
        raise invalid_request("ref_audio", "ref_audio: must be a data URL like data:audio/wav;base64,...")
    try:
        if not base64.b64decode(payload, validate=True):
            raise ValueError("empty")
    except (binascii.Error, ValueError):
        raise invalid_request("ref_audio", "ref_audio: the payload is empty or not valid base64") from None
    return value


def parse_speech_body(body: Any) -> SpeechRequest:
    """Check a decoded JSON body; model-independent."""
    if not isinstance(body, dict):
        raise invalid_request(None, "The request body must be a JSON object")
    unknown = [k for k in body if k not in OPENAI_FIELDS + SHIM_FIELDS + EXTENSION_FIELDS]
    for name in unknown:
        if not FIELD_NAME.fullmatch(name):
            # A key that is no name (a surrogate, 10 kB, spaces) is not echoed as `param`.
            allowed = ", ".join(OPENAI_FIELDS + SHIM_FIELDS + EXTENSION_FIELDS)
            raise invalid_request(None, f"unknown field {shown(name)}; allowed: {allowed} and the model's "
                                        "parameters", code="unknown_parameter")
    # vLLM-Omni's clients may leave `model` out: the server's default model (routes.py)
    model = _string(body, "model")
    if model is not None and not model.strip():
        raise invalid_request("model", "model: is empty")
    text = _string(body, "input", required=True, max_len=MAX_INPUT_CHARS)
    if not text.strip():
        raise invalid_request("input", "input: is empty")
    req = SpeechRequest(
        model=model.strip() if model is not None else None, input=text, voice=_voice(body),
        response_format=_choice(body, "response_format", RESPONSE_FORMATS, "mp3"),
        speed=_speed(body),
        stream_format=_choice(body, "stream_format", STREAM_FORMATS, "audio"),
        instructions=_string(body, "instructions", max_len=MAX_INSTRUCTIONS_CHARS),
    )
    stream = _boolean(body, "stream")
    if stream is False and req.stream_format == "sse":
        raise invalid_request("stream", "stream: false asks for the whole file in one response; "
                                        "stream_format sse is a stream of events (use stream_format audio)")
    req.stream = stream is not False
    ext: dict[str, Any] = {}
    for name in ("task_type", "language", "ref_text"):
        value = _string(body, name, max_len=MAX_INPUT_CHARS)
        if value is not None:
            ext[name] = value
    for name, lo, hi in (("seed", 0, 2**63 - 1), ("max_new_tokens", 1, None),
                         ("initial_codec_chunk_frames", 0, None)):
        value = _integer(body, name, lo, hi)
        if value is not None:
            ext[name] = value
    for name in ("x_vector_only_mode", "ignore_eos"):
        value = _boolean(body, name)
        if value is not None:
            ext[name] = value
    ref_audio = _string(body, "ref_audio")
    if ref_audio is not None:
        ext["ref_audio"] = _ref_audio(ref_audio)
    embedding = body.get("speaker_embedding")
    if embedding is not None:   # a list of numbers; the pipeline checks its length and values
        if not isinstance(embedding, list) or not embedding or len(embedding) > MAX_EMBEDDING:
            raise invalid_request("speaker_embedding", f"speaker_embedding: must be a list of 1..{MAX_EMBEDDING} "
                                                       "numbers")
        ext["speaker_embedding"] = embedding
    req.extensions = {name: ext[name] for name in EXTENSION_FIELDS if name in ext}
    req.model_params = {name: body[name] for name in unknown}
    return req


@dataclass
class TritonRequest:
    """What goes to the pipeline's entry model, and what the shim does itself."""
    pipeline: str
    text: str
    params: dict[str, Any]
    speed: SpeedPlan
    ignored: list[str] = field(default_factory=list)


def build_triton_params(req: SpeechRequest, info: PipelineInfo, registered: Any = None) -> TritonRequest:
    """Check the request against the resolved pipeline and produce Triton's PARAMS.
    ``registered``: an uploaded voice (``VoiceRegistry``) looked up by name; on a pipeline that
    clones voices, a request naming one (and carrying no ``ref_audio`` of its own) clones it: its
    recording as ``ref_audio``, or its speaker embedding as ``speaker_embedding``."""
    params: dict[str, Any] = {}
    ignored: list[str] = []
    voice = (registered.get(req.voice) if registered is not None and info.clones_voices and req.voice
             else None)
    clones = "ref_audio" in req.extensions or "speaker_embedding" in req.extensions
    if voice is not None and not clones and voice.is_embedding:
        if not info.accepts("speaker_embedding"):
            raise invalid_request("voice", f"voice: {voice.name!r} is a speaker embedding; model '{info.name}' "
                                           "clones from recordings only (upload one under another name)")
        req.extensions = {**req.extensions, "speaker_embedding": registered.embedding(voice)}
    elif voice is not None and not clones:
        req.extensions = dict(req.extensions)
        req.extensions["ref_audio"] = registered.data_url(voice)
        if voice.ref_text and "ref_text" not in req.extensions and not req.extensions.get("x_vector_only_mode"):
            req.extensions["ref_text"] = voice.ref_text
        elif not voice.ref_text and "ref_text" not in req.extensions and info.accepts("x_vector_only_mode"):
            # a pipeline without that flag clones from a recording alone by itself
            req.extensions["x_vector_only_mode"] = True
    else:
        voice = None

    for name, value in req.extensions.items():
        if name == "ignore_eos" and value is False and not info.accepts(name):
            continue   # stopping at eos is what every pipeline does
        if name in CLONE_FIELDS and info.known and not info.clones_voices:
            raise invalid_request(name, f"{name}: model '{info.name}' does not clone voices; "
                                        f"use one of its voices instead")
        target = next((n for n in EXTENSION_PARAM_NAMES.get(name, (name,)) if info.accepts(n)), None)
        if target is None:
            allowed = ", ".join(sorted(info.fields or {}))
            raise invalid_request(name, f"{name}: not supported by model '{info.name}'"
                                        f" (it accepts: {allowed or 'no extra fields'})",
                                  code="unsupported_parameter")
        params[target] = check_param(info, target, value, field=name)

    # OpenAI's stock voice names (alloy, nova, ...) mean "the model's default voice" unless the
    # model really has a voice of that name: the voice is then left out and the model decides.
    # No voice at all means the same (`default_voice` in GET /v1/models/{model}).
    voice_spec = info.voice_field
    stock = req.voice is None or req.voice.lower() in OPENAI_VOICES
    if voice is not None or req.voice is None:
        pass  # the registered voice is the reference audio
    elif info.clones_voices and clones:
        # the recording is the voice; vLLM-Omni's clients send a preset name beside it anyway
        if not stock:
            ignored.append("voice")
    elif info.clones_voices and (voice_spec is None or not voice_spec.choices) and not stock:
        known = [v.name for v in registered.list()] if registered is not None else []
        raise invalid_request("voice", f"voice: no registered voice named {req.voice!r} (registered: "
                                       f"{', '.join(known) or 'none'}); upload one to /v1/audio/voices or "
                                       "pass ref_audio")
    elif voice_spec is not None:
        if voice_spec.choices and req.voice.lower() not in {c.lower() for c in voice_spec.choices}:
            if not stock:
                raise invalid_request("voice", f"voice: unknown voice {shown(req.voice)} for model "
                                               f"'{info.name}'; available: {', '.join(voice_spec.choices)}")
        elif not (stock and not voice_spec.choices):
            params[voice_spec.name] = check_param(info, voice_spec.name, req.voice, field="voice")
    elif not info.known:
        if not stock:
            params["voice"] = req.voice
    elif not stock and not info.clones_voices:
        raise invalid_request("voice", f"voice: model '{info.name}' has no selectable voices")

    for name, value in req.model_params.items():
        if not info.known:   # pass-through: the model's own validation names it
            params[name] = value
            continue
        taken = {"text", "speed", "instructions"} | ({info.voice_field.name} if info.voice_field else set())
        if name not in info.fields or name in taken:
            allowed = ", ".join(OPENAI_FIELDS + SHIM_FIELDS + EXTENSION_FIELDS
                                + tuple(sorted(set(info.fields) - taken - set(EXTENSION_FIELDS))))
            raise invalid_request(name, f"{name}: unknown field for model '{info.name}'; allowed: {allowed}",
                                  code="unknown_parameter")
        params[name] = check_param(info, name, value)

    if req.instructions:
        if info.known and "instructions" in info.fields:
            params["instructions"] = check_param(info, "instructions", req.instructions)
        elif not info.known:
            params["instructions"] = req.instructions
        else:
            ignored.append("instructions")

    speed = plan_speed(req.speed, info.native_speed)
    if speed.native != 1.0:
        params["speed"] = speed.native
    return TritonRequest(pipeline=info.name, text=req.input, params=params, speed=speed, ignored=ignored)


def body_error(exc: Exception) -> ApiError:
    """A body that does not decode: not UTF-8, not JSON, or nested past the recursion limit."""
    if isinstance(exc, RecursionError):
        return invalid_request(None, "The request body is nested too deeply to be a speech request",
                               code="invalid_json")
    return invalid_request(None, f"The request body is not valid JSON ({exc})", code="invalid_json")
