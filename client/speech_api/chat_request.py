"""The body of `POST /v1/chat/completions`: OpenAI's fields, what each becomes for a chat
pipeline's entry model, and their checks.

As for speech, validation has two steps. `parse_chat_body` checks what every request must be
(types, ranges, the conversation's shape) without knowing the model. `build_chat_params` checks
the request against the pipeline it resolved to (its voices, its parameters' ranges) and makes
Triton's TEXT (the new user message) and PARAMS (the conversation before it, the voice, the
sampling). Every problem is a 400 naming the field in the request's own terms
(`messages[2].content`, `audio.voice`, `temperature`).

Every OpenAI field either works or is refused by name: fields that ask for something a chat
pipeline here cannot do (`n` > 1, `tools`, `logprobs`, a JSON `response_format`, ...)
are accepted only with their neutral value. Keys OpenAI does not define are the pipeline's own
parameters (`top_k`, `repetition_penalty`, a stage's own prefixed ones, ...), checked against its catalog.
"""
from __future__ import annotations

import math
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from client.speech_api.catalog import OPENAI_VOICES, PipelineInfo
from client.speech_api.errors import ApiError, invalid_request
from client.speech_api.field_checks import FIELD_NAME, check_param, clean_string
from client.speech_api.stage_sampling import FIELD as STAGE_SAMPLING
from client.speech_api.stage_sampling import apply_stage_sampling
from omni_backend.adapters.base import shown

# audio.format -> our encoder (client/speech_api/encoders); pcm16 is OpenAI's name for 24 kHz s16le.
AUDIO_FORMATS = {"wav": "wav", "mp3": "mp3", "flac": "flac", "opus": "opus", "aac": "aac", "pcm16": "pcm"}
MODALITIES = ("text", "audio")
ROLES = ("system", "developer", "user", "assistant")
# OpenAI fields this route implements.
CHAT_FIELDS = ("model", "messages", "modalities", "audio", "stream", "stream_options", "max_tokens",
               "max_completion_tokens", "temperature", "top_p", "seed", "stop",
               "speaker")   # vLLM-Omni's name of the voice (audio.voice)


def _neutral(*values: Any) -> Callable[[Any], bool]:
    """A check that passes null and exactly these values (`false` is not 0, `1.0` is not 1)."""
    return lambda v: v is None or any(v == x and type(v) is type(x) for x in values)


# OpenAI fields accepted only with a value that asks for nothing beyond what is implemented;
# anything else is a 400 naming the field (`unsupported_parameter`).
NEUTRAL_FIELDS = {
    "n": (_neutral(1), "only one choice is generated (n: 1)"),
    "frequency_penalty": (_neutral(0, 0.0), "not supported (use repetition_penalty, if the model has one)"),
    "presence_penalty": (_neutral(0, 0.0), "not supported (use repetition_penalty, if the model has one)"),
    "logit_bias": (_neutral({}), "not supported"),
    "logprobs": (_neutral(False), "log probabilities are not returned"),
    "top_logprobs": (_neutral(0), "log probabilities are not returned"),
    "tools": (_neutral([]), "tool calls are not supported"),
    "tool_choice": (_neutral("none"), "tool calls are not supported"),
    "parallel_tool_calls": (lambda v: v is None or isinstance(v, bool), "must be true or false"),
    "functions": (_neutral([]), "function calls are not supported"),
    "function_call": (_neutral("none"), "function calls are not supported"),
    "response_format": (_neutral({"type": "text"}), "only {\"type\": \"text\"} is supported"),
    "store": (_neutral(False), "completions are not stored"),
    "metadata": (lambda v: v is None or isinstance(v, dict), "must be an object"),
    "service_tier": (_neutral("auto", "default"), "only auto / default"),
    "reasoning_effort": (_neutral(), "not supported"),
    "verbosity": (_neutral(), "not supported"),
    "prediction": (_neutral(), "predicted outputs are not supported"),
    "web_search_options": (_neutral(), "web search is not supported"),
    "user": (lambda v: v is None or isinstance(v, str), "must be a string"),
    "safety_identifier": (lambda v: v is None or isinstance(v, str), "must be a string"),
    "prompt_cache_key": (lambda v: v is None or isinstance(v, str), "must be a string"),
    # vLLM-Omni's clients send it, empty; no video here, so no audio of a video either
    "mm_processor_kwargs": (_neutral({}, {"use_audio_in_video": False}), "processor options are not supported "
                            "(only {} or {\"use_audio_in_video\": false})"),
}
# PARAMS keys this route sets from OpenAI's fields; a body may not set them by their own name.
MAPPED_PARAMS = {"messages": "messages", "system": "a system message first in messages",
                 "voice": "audio.voice", "return_audio": "modalities",
                 "max_tokens": "max_completion_tokens", "temperature": "temperature", "top_p": "top_p",
                 "seed": "seed"}
_MESSAGE_INDEX = re.compile(r"messages\[(\d+)\]")
# How long an answer's transcript can be referred to by its audio id in a later request.
AUDIO_TTL_S = 3600
MAX_REMEMBERED_AUDIO = 4096


class AudioTranscripts:
    """Transcripts of recent audio answers by audio id: a client that sends an earlier answer
    back as `{"role": "assistant", "audio": {"id": ...}}` (OpenAI's multi-turn form) gets its
    text into the conversation. Bounded and expiring, like OpenAI's `expires_at`."""

    def __init__(self, ttl_s: float = AUDIO_TTL_S, limit: int = MAX_REMEMBERED_AUDIO):
        self.ttl_s = ttl_s
        self.limit = limit
        self._items: OrderedDict[str, tuple[float, str]] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, audio_id: str, transcript: str) -> int:
        """Keep `transcript`; returns its expiry (Unix seconds)."""
        expires = time.time() + self.ttl_s
        with self._lock:
            self._items[audio_id] = (expires, transcript)
            while len(self._items) > self.limit:
                self._items.popitem(last=False)
        return int(expires)

    def get(self, audio_id: str) -> str | None:
        with self._lock:
            item = self._items.get(audio_id)
            if item is None or item[0] < time.time():
                self._items.pop(audio_id, None)
                return None
            return item[1]


@dataclass
class ChatRequest:
    model: str
    history: list[dict[str, Any]]   # the conversation before the new user message ({role, content})
    text: str                       # the new user message ("" when `parts` carries it)
    audio: bool = False             # "audio" in modalities
    voice: str | None = None
    voice_field: str = "audio.voice"  # where the voice came from (vLLM-Omni's clients: speaker)
    audio_format: str | None = None  # AUDIO_FORMATS key
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    max_tokens_field: str = "max_completion_tokens"
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = None   # OpenAI's stop sequences (a string is a list of one)
    extensions: dict[str, Any] = field(default_factory=dict)   # the pipeline's own parameters
    parts: list[dict[str, Any]] | None = None   # the new user message's parts when it holds media
    # where an `audio_url` part stood ("messages[0].content[1]"), sent on as `input_audio`
    audio_url_parts: tuple[str, ...] = ()

    @property
    def encoder_format(self) -> str | None:
        return AUDIO_FORMATS[self.audio_format] if self.audio_format else None

    def prompt_text(self) -> str:
        """Every message's text (for the usage estimate)."""
        last = _text_of(self.parts) if self.parts is not None else self.text
        return "\n".join([*(_text_of(m["content"]) for m in self.history), last])


def _text_of(content: str | list[dict[str, Any]]) -> str:
    # as the pipeline's chat template joins text parts: without a separator
    return content if isinstance(content, str) else "".join(p["text"] for p in content if p["type"] == "text")


def _bool(body: dict, name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid_request(name, f"{name}: must be true or false, got {shown(value)}")
    return value


def _number(body: dict, name: str, lo: float, hi: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or (isinstance(value, float) and not math.isfinite(value))):
        raise invalid_request(name, f"{name}: must be a number, got {shown(value)}")
    if not lo <= value <= hi:
        raise invalid_request(name, f"{name}: must be in [{lo:g}, {hi:g}], got {shown(value)}")
    return float(value)


def _integer(body: dict, name: str, lo: int, hi: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_request(name, f"{name}: must be an integer, got {shown(value)}")
    if not lo <= value <= hi:
        raise invalid_request(name, f"{name}: must be in [{lo}, {hi}], got {shown(value)}")
    return value


def _content(value: Any, where: str, media: bool) -> str | list[dict[str, Any]]:
    """A message's content: a string, or a non-empty list of parts: text, and in user messages
    OpenAI's `input_audio` (base64 audio) and `image_url` (a data URL, or an http(s) URL the
    server fetches when its operator allowed the host: client/speech_api/media_fetch.py); the
    pipeline decodes them and names what it cannot read."""
    if isinstance(value, str):
        return clean_string(where, value)
    if not isinstance(value, list) or not value:
        raise invalid_request(where, f"{where}: must be a string or a non-empty list of content parts")
    parts = []
    for j, part in enumerate(value):
        at = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise invalid_request(at, f"{at}: must be an object like {{\"type\": \"text\", \"text\": ...}}")
        kind = part.get("type")
        if kind == "input_audio" and media:
            parts.append(_input_audio(part, at))
            continue
        if kind == "image_url" and media:
            parts.append(_image_url(part, at))
            continue
        if kind == "audio_url" and media:
            parts.append(_audio_url(part, at))
            continue
        if kind != "text":
            allowed = "text, input_audio, audio_url and image_url parts" if media else "text parts"
            raise invalid_request(f"{at}.type", f"{at}.type: only {allowed} are supported here, got "
                                                f"{shown(kind)}", code="unsupported_parameter")
        extra = set(part) - {"type", "text"}
        if extra:
            raise invalid_request(at, f"{at}: unknown key(s) {', '.join(sorted(map(str, extra)))}")
        if not isinstance(part.get("text"), str):
            raise invalid_request(f"{at}.text", f"{at}.text: must be a string")
        parts.append({"type": "text", "text": clean_string(f"{at}.text", part["text"])})
    return parts


def _input_audio(part: dict, at: str) -> dict[str, Any]:
    extra = set(part) - {"type", "input_audio"}
    if extra:
        raise invalid_request(at, f"{at}: unknown key(s) {', '.join(sorted(map(str, extra)))}")
    spec = part.get("input_audio")
    if not isinstance(spec, dict):
        raise invalid_request(f"{at}.input_audio", f"{at}.input_audio: must be an object {{\"data\": base64 "
                                                   "audio, \"format\": \"wav\" | \"mp3\" | ...}")
    for key in spec:
        if key not in ("data", "format"):
            name = f"{at}.input_audio.{key}" if isinstance(key, str) and FIELD_NAME.fullmatch(key) else f"{at}.input_audio"
            raise invalid_request(name, f"{name}: unknown key (input_audio takes data and format)")
    if not isinstance(spec.get("data"), str):
        raise invalid_request(f"{at}.input_audio.data", f"{at}.input_audio.data: must be base64 audio",
                              code="missing_required_parameter" if spec.get("data") is None else "invalid_value")
    if spec.get("format") is not None and not isinstance(spec["format"], str):
        raise invalid_request(f"{at}.input_audio.format", f"{at}.input_audio.format: must be a string")
    return {"type": "input_audio", "input_audio": dict(spec)}


def _image_url(part: dict, at: str) -> dict[str, Any]:
    extra = set(part) - {"type", "image_url"}
    if extra:
        raise invalid_request(at, f"{at}: unknown key(s) {', '.join(sorted(map(str, extra)))}")
    spec = part.get("image_url")
    if isinstance(spec, str):   # the short form some clients send
        spec = {"url": spec}
    if not isinstance(spec, dict):
        raise invalid_request(f"{at}.image_url", f"{at}.image_url: must be an object {{\"url\": ...}}")
    for key in spec:
        if key not in ("url", "detail"):
            name = f"{at}.image_url.{key}" if isinstance(key, str) and FIELD_NAME.fullmatch(key) else f"{at}.image_url"
            raise invalid_request(name, f"{name}: unknown key (image_url takes url and detail)")
    if not isinstance(spec.get("url"), str) or not spec["url"].strip():
        raise invalid_request(f"{at}.image_url.url", f"{at}.image_url.url: must be a data URL or an http(s) URL",
                              code="missing_required_parameter" if spec.get("url") is None else "invalid_value")
    if spec.get("detail") not in (None, "auto", "low", "high"):
        raise invalid_request(f"{at}.image_url.detail", f"{at}.image_url.detail: must be auto, low or high")
    return {"type": "image_url", "image_url": dict(spec)}


def _audio_url(part: dict, at: str) -> dict[str, Any]:
    """vLLM's `audio_url` part (a data URL, or an http(s) URL fetched as for images); it becomes
    an `input_audio` part once its audio is at hand (media_fetch.py)."""
    extra = set(part) - {"type", "audio_url"}
    if extra:
        raise invalid_request(at, f"{at}: unknown key(s) {', '.join(sorted(map(str, extra)))}")
    spec = part.get("audio_url")
    if isinstance(spec, str):   # the short form
        spec = {"url": spec}
    if not isinstance(spec, dict):
        raise invalid_request(f"{at}.audio_url", f"{at}.audio_url: must be an object {{\"url\": ...}}")
    for key in spec:
        if key != "url":
            name = f"{at}.audio_url.{key}" if isinstance(key, str) and FIELD_NAME.fullmatch(key) else f"{at}.audio_url"
            raise invalid_request(name, f"{name}: unknown key (audio_url takes url)")
    if not isinstance(spec.get("url"), str) or not spec["url"].strip():
        raise invalid_request(f"{at}.audio_url.url", f"{at}.audio_url.url: must be a data URL or an http(s) URL",
                              code="missing_required_parameter" if spec.get("url") is None else "invalid_value")
    return {"type": "audio_url", "audio_url": dict(spec)}


def _has_media(content: str | list[dict[str, Any]]) -> bool:
    return not isinstance(content, str) and any(p["type"] != "text" for p in content)


def _message(value: Any, i: int, transcripts: AudioTranscripts | None) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(value, dict):
        raise invalid_request(where, f"{where}: must be an object with role and content")
    role = value.get("role")
    if role in ("tool", "function"):
        raise invalid_request(f"{where}.role", f"{where}.role: {role} messages are not supported (no tool calls)",
                              code="unsupported_parameter")
    if role not in ROLES:
        raise invalid_request(f"{where}.role", f"{where}.role: must be one of {', '.join(ROLES)}, got {shown(role)}")
    allowed = {"role", "content", "name"} | ({"audio", "refusal", "tool_calls", "function_call"}
                                             if role == "assistant" else set())
    for key in value:
        if key not in allowed:
            name = f"{where}.{key}" if isinstance(key, str) and FIELD_NAME.fullmatch(key) else where
            raise invalid_request(name, f"{name}: not supported in a {role} message", code="unsupported_parameter")
    for key in ("tool_calls", "function_call", "refusal"):
        if value.get(key) not in (None, []):
            raise invalid_request(f"{where}.{key}", f"{where}.{key}: not supported (no tool calls or refusals)",
                                  code="unsupported_parameter")
    if value.get("name") is not None and not isinstance(value["name"], str):
        raise invalid_request(f"{where}.name", f"{where}.name: must be a string")
    content = value.get("content")
    audio = value.get("audio")
    if role == "assistant" and content is None and audio is not None:
        # an earlier audio answer referred to by id: its transcript is the turn's text
        audio_id = audio.get("id") if isinstance(audio, dict) else None
        if not isinstance(audio_id, str) or set(audio) != {"id"}:
            raise invalid_request(f"{where}.audio", f"{where}.audio: must be {{\"id\": ...}} of an earlier answer")
        content = transcripts.get(audio_id) if transcripts is not None else None
        if content is None:
            raise invalid_request(f"{where}.audio.id", f"{where}.audio.id: no audio answer {shown(audio_id)} here "
                                                       "(unknown or expired); send its transcript as content")
        return {"role": role, "content": content}
    if content is None:
        raise invalid_request(f"{where}.content", f"{where}.content: is required", code="missing_required_parameter")
    return {"role": "system" if role == "developer" else role,
            "content": _content(content, f"{where}.content", media=role == "user")}


def _messages(body: dict, transcripts: AudioTranscripts | None) -> tuple[list[dict[str, Any]], str,
                                                                        list[dict[str, Any]] | None]:
    value = body.get("messages")
    if value is None:
        raise invalid_request("messages", "messages: is required", code="missing_required_parameter")
    if not isinstance(value, list) or not value:
        raise invalid_request("messages", "messages: must be a non-empty list of {role, content}")
    # a system (or developer) message may come anywhere, several times: the checkpoint's chat
    # template renders it where it stands (or refuses it: a 400 naming messages)
    messages = [_message(m, i, transcripts) for i, m in enumerate(value)]
    last = messages[-1]
    if last["role"] != "user":
        at = f"messages[{len(messages) - 1}].role"
        raise invalid_request(at, f"{at}: the last message must be the user's (the answer is generated)")
    if _has_media(last["content"]):   # the whole message goes as parts; TEXT stays empty
        return messages[:-1], "", list(last["content"])
    text = _text_of(last["content"])
    if not text.strip():
        at = f"messages[{len(messages) - 1}].content"
        raise invalid_request(at, f"{at}: is empty")
    return messages[:-1], text, None


def _audio(body: dict) -> tuple[str, str]:
    value = body.get("audio")
    speaker = body.get("speaker")
    if speaker is not None and (not isinstance(speaker, str) or not speaker.strip()):
        raise invalid_request("speaker", f"speaker: must be a voice name, got {shown(speaker)}")
    if value is None:
        # vLLM-Omni's clients ask for audio with no `audio` object: their voice is `speaker` (else
        # the model's default) and their audio wav
        return clean_string("speaker", (speaker or "").strip()), "wav"
    if not isinstance(value, dict):
        raise invalid_request("audio", "audio: must be an object {\"voice\": ..., \"format\": ...}")
    extra = [k for k in value if k not in ("voice", "format")]
    if extra:
        raise invalid_request("audio", f"audio: unknown key {shown(extra[0])}; use voice and format")
    voice = value.get("voice")
    if isinstance(voice, dict) and set(voice) == {"id"}:   # OpenAI's custom-voice form
        voice = voice["id"]
    if voice is None:
        raise invalid_request("audio.voice", "audio.voice: is required", code="missing_required_parameter")
    if not isinstance(voice, str) or not voice.strip():
        raise invalid_request("audio.voice", f"audio.voice: must be a voice name, got {shown(voice)}")
    if speaker is not None and speaker.strip().lower() != voice.strip().lower():
        raise invalid_request("speaker", "speaker: another name for audio.voice; give one of them")
    fmt = value.get("format")
    if fmt is None:
        raise invalid_request("audio.format", "audio.format: is required", code="missing_required_parameter")
    if fmt not in AUDIO_FORMATS:
        raise invalid_request("audio.format", f"audio.format: unknown value {shown(fmt)}; use one of "
                                              f"{', '.join(AUDIO_FORMATS)}")
    return clean_string("audio.voice", voice.strip()), fmt


def parse_chat_body(body: Any, transcripts: AudioTranscripts | None = None) -> ChatRequest:
    """Check a decoded JSON body; model-independent."""
    if not isinstance(body, dict):
        raise invalid_request(None, "The request body must be a JSON object")
    extensions: dict[str, Any] = {}
    for key, value in body.items():
        if key in CHAT_FIELDS:
            continue
        if key in NEUTRAL_FIELDS:
            ok, why = NEUTRAL_FIELDS[key]
            if not ok(value):
                raise invalid_request(key, f"{key}: {why}", code="unsupported_parameter")
        elif FIELD_NAME.fullmatch(key):
            extensions[key] = value     # a pipeline parameter, or a 400 once the pipeline is known
        else:   # a key that is no name (a surrogate, 10 kB, spaces) is not echoed as `param`
            raise invalid_request(None, f"unknown field {shown(key)}", code="unknown_parameter")
    model = body.get("model")
    if model is None:
        raise invalid_request("model", "model: is required", code="missing_required_parameter")
    if not isinstance(model, str) or not model.strip():
        raise invalid_request("model", f"model: must be a model name, got {shown(model)}")
    history, text, parts = _messages(body, transcripts)

    modalities = body.get("modalities")
    if modalities is None:
        modalities = ["text"]
    # ["audio"] (vLLM-Omni's clients) is answered as ["text", "audio"]: with audio, OpenAI's answer
    # carries its text as the audio's transcript, not as content, either way
    if (not isinstance(modalities, list) or not modalities or any(m not in MODALITIES for m in modalities)
            or len(set(modalities)) != len(modalities)):
        raise invalid_request("modalities", f"modalities: must be [\"text\"], [\"text\", \"audio\"] or "
                                            f"[\"audio\"], got {shown(modalities)}")
    req = ChatRequest(model=clean_string("model", model.strip()), history=history, text=text,
                      audio="audio" in modalities, stream=_bool(body, "stream"), parts=parts)
    if req.audio:
        req.voice, req.audio_format = _audio(body)
        if body.get("audio") is None:
            req.voice_field = "speaker"
    else:
        for name in ("audio", "speaker"):
            if body.get(name) is not None:
                raise invalid_request(name, f"{name}: only with modalities that ask for audio "
                                            "([\"text\", \"audio\"])")

    options = body.get("stream_options")
    if options is not None:
        if not req.stream:
            raise invalid_request("stream_options", "stream_options: only with stream: true")
        if not isinstance(options, dict) or any(k != "include_usage" for k in options):
            raise invalid_request("stream_options", "stream_options: only {\"include_usage\": true|false}")
        req.include_usage = _bool(options, "include_usage")

    limits = {name: _integer(body, name, 1, 2**31 - 1) for name in ("max_completion_tokens", "max_tokens")}
    given = {k: v for k, v in limits.items() if v is not None}
    if len(given) == 2 and limits["max_tokens"] != limits["max_completion_tokens"]:
        raise invalid_request("max_tokens", "max_tokens: differs from max_completion_tokens; send one of them")
    if given:
        req.max_tokens_field, req.max_tokens = next(iter(given.items()))
    req.temperature = _number(body, "temperature", 0.0, 2.0)
    req.top_p = _number(body, "top_p", 0.0, 1.0)
    req.seed = _integer(body, "seed", -(2**63), 2**63 - 1)
    req.stop = _stop(body.get("stop"))
    req.extensions = extensions
    return req


def _stop(value: Any) -> list[str] | None:
    """OpenAI's `stop`: null, a string, or a list of strings (an empty list asks for nothing). How
    many and how long is the model's to say."""
    if value is None or value == []:
        return None
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid_request("stop", f"stop: must be a string or a list of strings, got {shown(value)}")
    for i, stop in enumerate(stops):
        clean_string("stop" if isinstance(value, str) else f"stop[{i}]", stop)
    return stops


@dataclass
class ChatTritonRequest:
    """What goes to the chat pipeline's entry model, and the request field of each PARAMS key
    (so Triton's `invalid_request: <key>:` names what the client sent)."""
    pipeline: str
    text: str
    params: dict[str, Any]
    fields: dict[str, str]
    messages_offset: int = 0   # PARAMS.messages[i] is the body's messages[i + offset]
    audio_url_parts: tuple[str, ...] = ()   # ChatRequest.audio_url_parts


def _voice(voice: str, info: PipelineInfo, put, params: dict[str, Any], field: str = "audio.voice") -> None:
    """audio.voice -> the pipeline's speaker parameter. OpenAI's stock names (alloy, ...) mean the
    model's default voice unless the model has a voice of that name, as for /v1/audio/speech."""
    if not voice:   # none given (vLLM-Omni's clients): the model's default
        return
    spec = info.voice_field
    choices = spec.choices if spec is not None else None
    choice = next((c for c in choices or () if c.lower() == voice.lower()), None)
    if choice is not None:
        put(spec.name, choice, field)
    elif voice.lower() in OPENAI_VOICES:
        return
    elif spec is not None and not choices:   # the model checks it
        put(spec.name, voice, field)
    elif not info.known:                     # pass-through: the chat contract's name
        params["speaker"] = voice
    else:
        available = ", ".join(choices) if choices else "none to choose"
        raise invalid_request(field, f"{field}: unknown voice {shown(voice)} for model '{info.name}'; "
                                             f"available: {available}")


def build_chat_params(req: ChatRequest, info: PipelineInfo) -> ChatTritonRequest:
    """Check the request against the resolved chat pipeline and produce TEXT and PARAMS."""
    params: dict[str, Any] = {}
    fields = {"text": f"messages[{len(req.history)}].content"}

    def put(name: str, value: Any, field: str) -> None:
        if not info.accepts(name):
            raise invalid_request(field, f"{field}: not supported by model '{info.name}'",
                                  code="unsupported_parameter")
        params[name] = check_param(info, name, value, field=field)
        fields[name] = field

    history = list(req.history)
    offset = 0
    if history and history[0]["role"] == "system":
        put("system", _text_of(history.pop(0)["content"]), "messages[0].content")
        offset = 1
    if history:
        put("messages", history, "messages")
    if req.parts is not None:
        put("content", req.parts, f"messages[{len(req.history)}].content")

    if req.audio and not info.speaks:
        raise invalid_request("modalities", f"modalities: model '{info.name}' answers in text only (its checkpoint "
                                            "does not speak); use [\"text\"]")
    if not req.audio and info.accepts("return_audio"):   # text only: the audio stages are skipped
        params["return_audio"] = False
        fields["return_audio"] = "modalities"
    if req.audio:
        _voice(req.voice or "", info, put, params, req.voice_field)

    if req.max_tokens is not None:
        put("max_tokens", req.max_tokens, req.max_tokens_field)
    if req.temperature is not None:
        if req.temperature == 0.0:   # OpenAI's greedy
            if req.extensions.get("do_sample") is True:
                raise invalid_request("do_sample", "do_sample: true contradicts temperature 0 (greedy)")
            put("do_sample", False, "temperature")
        else:
            if "do_sample" not in req.extensions and info.accepts("do_sample"):
                params["do_sample"] = True
                fields["do_sample"] = "temperature"
            put("temperature", req.temperature, "temperature")
    if req.top_p is not None:
        put("top_p", req.top_p, "top_p")
    if req.seed is not None:
        put("seed", req.seed, "seed")
    if req.stop:
        put("stop", req.stop, "stop")

    for name, value in req.extensions.items():
        if name == STAGE_SAMPLING:   # vLLM-Omni's per-stage sampling (stage_sampling.py)
            apply_stage_sampling(value, info.stage_sampling, req.audio, params, put)
            continue
        if name in MAPPED_PARAMS:
            raise invalid_request(name, f"{name}: set by this route; use {MAPPED_PARAMS[name]}",
                                  code="unsupported_parameter")
        if not info.known or name not in info.fields:
            raise invalid_request(name, f"{name}: unknown field for model '{info.name}' (OpenAI's chat fields, "
                                        "or one of the model's parameters: GET /v1/models/{model})",
                                  code="unknown_parameter")
        put(name, value, name)
    return ChatTritonRequest(pipeline=info.name, text=req.text, params=params, fields=fields,
                             messages_offset=offset, audio_url_parts=req.audio_url_parts)


def chat_error(error: ApiError, triton: ChatTritonRequest) -> ApiError:
    """A 400 from Triton naming a PARAMS key, renamed to the request field it came from."""
    if error.status != 400 or error.param is None:
        return error
    name = "text" if error.param == "input" else error.param
    field = triton.fields.get(name)
    if field is None and name.startswith("content[") and "content" in triton.fields:
        field = triton.fields["content"] + name[len("content"):]   # PARAMS.content[j]...: the new message's parts
    at = _MESSAGE_INDEX.match(name)
    if field is None and at is not None:   # PARAMS.messages[i]...: the body's messages[i + offset]...
        field = f"messages[{int(at[1]) + triton.messages_offset}]{name[at.end():]}"
    if field is None:
        return error
    for part in triton.audio_url_parts:   # the client sent this recording as an audio_url
        if field.startswith(f"{part}.input_audio"):
            field = f"{part}.audio_url.url"
    message = error.message
    if message.startswith(f"{error.param}:"):
        message = field + message[len(error.param):]
    return invalid_request(field, message, code=error.code or "invalid_value")


def refuse_chat_pipeline(info: PipelineInfo | None) -> None:
    """The speech routes read their input aloud; a chat pipeline would answer it instead."""
    if info is not None and info.chat:
        raise invalid_request("model", f"model: '{info.name}' answers a conversation rather than reading "
                                       "its input aloud; use POST /v1/chat/completions")
