"""The request contract shared by every pipeline, and the adapter registry.

An entry model receives TEXT (UTF-8 bytes) and PARAMS (a JSON object, optional). The adapter
checks both and returns the normalized request that stage 0 receives (and may say which stages
that request skips, `skipped_stages`); any problem raises
`InvalidRequest` naming the field, whatever the bytes: invalid UTF-8, lone surrogates (as
UTF-8-encoded surrogate bytes or as JSON `\\ud800` escapes), NUL characters, JSON nested past the
recursion limit, oversized PARAMS, values of the wrong type or out of range. Messages quote a
client's value only shortened and escaped (`shown`), so an error can always be sent back.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omni_backend.errors import InvalidRequest

if TYPE_CHECKING:
    from omni_backend.deploy import DeployConfig

MAX_TEXT_CHARS = 4096
MAX_TEXT_BYTES = 4 * MAX_TEXT_CHARS       # UTF-8 takes at most 4 bytes per character
MAX_PARAMS_BYTES = 64 * 1024              # PARAMS of a pipeline without large fields
MAX_SHOWN_CHARS = 40
# A parameter name that an error may quote as its field; anything else is reported as `params`.
_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# In a Python str a valid astral character is one code point, so any code point in this range is
# an unpaired surrogate: not encodable as UTF-8, and fatal to tokenizers and to Triton's strings.
_SURROGATE = re.compile("[\ud800-\udfff]")


def shown(value: Any) -> str:
    """A client's value as an error message may quote it: short, escaped (repr escapes lone
    surrogates and control characters), never the repr of a container (unbounded, recursive)."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 100:
        return f"an integer of {value.bit_length()} bits"   # repr of a huge int is slow or refused
    text = repr(value)
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS - 3] + "..."


def check_string(field: str, value: str) -> None:
    """Strings that reach a tokenizer or go back into Triton: no unpaired surrogates, no NUL."""
    bad = _SURROGATE.search(value)
    if bad is not None:
        raise InvalidRequest(field, f"contains an unpaired surrogate (U+{ord(bad.group()):04X}) at "
                                    f"character {bad.start()}")
    nul = value.find("\0")
    if nul >= 0:
        raise InvalidRequest(field, f"contains a NUL character at character {nul}")


@dataclass(frozen=True)
class Param:
    """One request parameter: type, range, choices, default."""
    name: str
    kind: type                    # int, float, str, bool, or list (of numbers, at most max_len)
    default: Any = None
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] | None = None
    max_len: int | None = None
    help: str = ""

    def to_dict(self) -> dict[str, Any]:
        """What a client may know of the parameter (the built repository's catalog)."""
        d = {"name": self.name, "type": self.kind.__name__, "default": self.default, "lo": self.lo,
             "hi": self.hi, "choices": list(self.choices) if self.choices else None,
             "max_len": self.max_len, "help": self.help}
        return {k: v for k, v in d.items() if v not in (None, "")}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Param":
        kinds = {"int": int, "float": float, "str": str, "bool": bool, "list": list}
        return cls(name=d["name"], kind=kinds[d["type"]], default=d.get("default"), lo=d.get("lo"),
                   hi=d.get("hi"), choices=tuple(d["choices"]) if d.get("choices") else None,
                   max_len=d.get("max_len"), help=d.get("help", ""))

    def check(self, value: Any) -> Any:
        if value is None:
            return self.default
        if self.kind is bool:
            if not isinstance(value, bool):
                raise InvalidRequest(self.name, f"must be true or false, got {shown(value)}")
            return value
        if self.kind is list:
            if not isinstance(value, list) or not value:
                raise InvalidRequest(self.name, f"must be a non-empty list of numbers, got {shown(value)}")
            if self.max_len is not None and len(value) > self.max_len:
                raise InvalidRequest(self.name, f"must have at most {self.max_len} numbers, got {len(value)}")
            out = []
            for i, x in enumerate(value):
                try:
                    number = float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan
                except OverflowError:   # a 400-digit integer
                    number = math.nan
                if not math.isfinite(number):
                    raise InvalidRequest(self.name, f"element {i} must be a finite number, got {shown(x)}")
                out.append(number)
            return out
        if self.kind in (int, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if ok and isinstance(value, float):
                ok = math.isfinite(value) and (self.kind is float or value.is_integer())
            if not ok:
                raise InvalidRequest(self.name, f"must be {'an integer' if self.kind is int else 'a number'}, "
                                                f"got {shown(value)}")
            # Compare before converting: int and float compare exactly, while float() of a
            # 400-digit integer overflows.
            if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
                raise InvalidRequest(self.name, f"must be in [{self.lo}, {self.hi}], got {shown(value)}")
            return self.kind(value)
        if not isinstance(value, str):
            raise InvalidRequest(self.name, f"must be a string, got {shown(value)}")
        if self.max_len is not None and len(value) > self.max_len:
            raise InvalidRequest(self.name, f"must be at most {self.max_len} characters, got {len(value)}")
        check_string(self.name, value)
        if self.choices is None:
            return value
        # a choice matches whatever its case, and is given on as the choice is written
        choice = next((c for c in self.choices if c.lower() == value.lower()), None)
        if choice is None:
            raise InvalidRequest(self.name, f"unknown value {shown(value)}; available: {', '.join(self.choices)}")
        return choice


def _utf8(field: str, raw: bytes) -> str:
    """Strict UTF-8: rejects encoded surrogates (b"\\xed\\xa0\\x80"), overlong forms, stray bytes."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidRequest(field, f"is not valid UTF-8 (byte {e.start}: {e.reason})") from None


def decode_text(raw: bytes | str) -> str:
    """TEXT checks shared by all pipelines: UTF-8, no NUL, not blank, at most 4096 characters."""
    if isinstance(raw, bytes):
        if len(raw) > MAX_TEXT_BYTES:   # before decoding: the limit holds for any encoding
            raise InvalidRequest("text", f"is {len(raw)} bytes; the limit is {MAX_TEXT_CHARS} characters")
        text = _utf8("text", raw)
    elif isinstance(raw, str):
        text = raw
    else:
        raise InvalidRequest("text", f"must be a string, got {shown(raw)}")
    if len(text) > MAX_TEXT_CHARS:
        raise InvalidRequest("text", f"is {len(text)} characters; the limit is {MAX_TEXT_CHARS}")
    check_string("text", text)
    if not text.strip():
        raise InvalidRequest("text", "is empty")
    return text


def decode_params(raw: bytes | str | None, max_bytes: int = MAX_PARAMS_BYTES) -> dict[str, Any]:
    """PARAMS: absent or blank means {}; otherwise a JSON object of at most `max_bytes`."""
    if raw is None or not raw.strip():
        return {}
    if len(raw) > max_bytes:
        raise InvalidRequest("params", f"is {len(raw)} bytes; the limit is {max_bytes}")
    # json.loads would decode bytes with "surrogatepass" and let encoded surrogates through.
    text = _utf8("params", raw) if isinstance(raw, bytes) else raw
    try:
        params = json.loads(text)
    except RecursionError:
        # The C scanner stops at the interpreter's recursion limit; parameters are flat anyway.
        raise InvalidRequest("params", "is nested too deeply (parameters are a flat JSON object)") from None
    except ValueError as e:
        raise InvalidRequest("params", f"is not valid JSON ({e})") from None
    if not isinstance(params, dict):
        raise InvalidRequest("params", f"must be a JSON object, got {_json_type(params)}")
    return params


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def zero_temperature_is_greedy(params: dict[str, Any]) -> None:
    """Temperature 0 means greedy decoding, as in OpenAI's and vLLM's APIs (``vllm bench serve
    --temperature 0`` sends it): ``do_sample`` false, no temperature."""
    if params.get("temperature") == 0.0:
        if params.get("do_sample"):
            raise InvalidRequest("temperature", "0 means greedy, but do_sample is true")
        params["do_sample"], params["temperature"] = False, None


class TTSAdapter:
    """Validates a request for one pipeline and builds the request its first stages receive.

    Subclasses list their `params`; `context` carries what the loaded model knows (speakers,
    languages) so validation matches the checkpoint actually served.
    """
    params: tuple[Param, ...] = ()
    max_params_bytes = MAX_PARAMS_BYTES

    def __init__(self, context: dict[str, Any] | None = None):
        self.context = context or {}

    @classmethod
    def from_model(cls, model_path: str | None, deploy: "DeployConfig | None" = None) -> "TTSAdapter":
        """An adapter for the checkpoint being served (reads only its config, no weights) as the
        deploy serves it (a family may read its stages' options, e.g. the voices a finetune has)."""
        return cls()

    def param_specs(self) -> dict[str, Param]:
        return {p.name: p for p in self.params}

    def describe(self) -> dict[str, Any]:
        """What the speech API needs to know of the served checkpoint without loading model code:
        its parameters, voices and whether it clones voices (written into the built repository)."""
        voice = self.param_specs().get("voice")
        return {"params": [p.to_dict() for p in self.params],
                "voices": list(voice.choices) if voice is not None and voice.choices else [],
                "clones_voices": "ref_audio" in self.param_specs()}

    def validate(self, text: bytes | str, params: bytes | str | dict | None) -> dict[str, Any]:
        """Return the normalized request {"text": ..., **params}; raise InvalidRequest."""
        text = decode_text(text)
        raw = params if isinstance(params, dict) else decode_params(params, self.max_params_bytes)
        return self.validate_params(text, raw)

    def validate_params(self, text: str, raw: dict[str, Any]) -> dict[str, Any]:
        """The normalized request for checked ``text`` and decoded PARAMS ``raw``."""
        specs = self.param_specs()
        for k in raw:
            if k not in specs:
                allowed = ", ".join(sorted(specs))
                if isinstance(k, str) and _FIELD_NAME.fullmatch(k):
                    raise InvalidRequest(k, f"unknown parameter; allowed: {allowed}")
                # A key that is no name (spaces, colons, surrogates, 10 kB) would garble the
                # `<field>:` of the message: the field is PARAMS itself.
                raise InvalidRequest("params", f"unknown parameter {shown(k)}; allowed: {allowed}")
        out = {name: spec.check(raw.get(name)) for name, spec in specs.items()}
        if "temperature" in specs and "do_sample" in specs:
            zero_temperature_is_greedy(out)
        out = self.check(text, out)
        out["text"] = text
        return out

    def check(self, text: str, params: dict[str, Any]) -> dict[str, Any]:
        """Model-specific cross-field rules; override."""
        return params

    def unserved_stages(self) -> frozenset[int]:
        """Stage ids the served checkpoint never runs (it has no weights for them, e.g. the audio
        stages of a checkpoint that answers in text only): the builder writes no model for them,
        so no process is started for them, and the entry never calls them. Override; by default
        every stage is served."""
        return frozenset()

    def skipped_stages(self, request: dict[str, Any]) -> frozenset[int]:
        """Stage ids that this validated request does not run (e.g. the audio stages of a
        text-only answer); their consumers are skipped too, and when the final stage is skipped
        the client gets only the other stages' client outputs (PipelineConfig.stages_run).
        Override; by default every stage runs."""
        return frozenset()
