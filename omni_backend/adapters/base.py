"""The request contract shared by every pipeline, and the adapter registry.

An entry model receives TEXT (UTF-8 bytes) and PARAMS (a JSON object, optional). The adapter
checks both and returns the normalized request that stage 0 receives; any problem raises
`InvalidRequest` naming the field.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from omni_backend.errors import InvalidRequest

MAX_TEXT_CHARS = 4096


@dataclass(frozen=True)
class Param:
    """One request parameter: type, range, choices, default."""
    name: str
    kind: type                    # int, float, str, bool
    default: Any = None
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] | None = None
    max_len: int | None = None
    help: str = ""

    def check(self, value: Any) -> Any:
        if value is None:
            return self.default
        if self.kind is bool:
            if not isinstance(value, bool):
                raise InvalidRequest(self.name, f"must be true or false, got {value!r}")
            return value
        if self.kind in (int, float):
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if self.kind is int and ok and isinstance(value, float):
                ok = value.is_integer()
            if not ok or (isinstance(value, float) and not math.isfinite(value)):
                raise InvalidRequest(self.name, f"must be {'an integer' if self.kind is int else 'a number'}, got {value!r}")
            value = self.kind(value)
            if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
                raise InvalidRequest(self.name, f"must be in [{self.lo}, {self.hi}], got {value!r}")
            return value
        if not isinstance(value, str):
            raise InvalidRequest(self.name, f"must be a string, got {value!r}")
        if self.max_len is not None and len(value) > self.max_len:
            raise InvalidRequest(self.name, f"must be at most {self.max_len} characters, got {len(value)}")
        if self.choices is not None and value.lower() not in self.choices:
            raise InvalidRequest(self.name, f"unknown value {value!r}; available: {', '.join(self.choices)}")
        return value.lower() if self.choices is not None else value


def decode_text(raw: bytes | str) -> str:
    """TEXT checks shared by all pipelines: UTF-8, not blank, at most 4096 characters."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InvalidRequest("text", f"is not valid UTF-8 (byte {e.start})") from None
    else:
        text = raw
    if not text.strip():
        raise InvalidRequest("text", "is empty")
    if len(text) > MAX_TEXT_CHARS:
        raise InvalidRequest("text", f"is {len(text)} characters; the limit is {MAX_TEXT_CHARS}")
    return text


def decode_params(raw: bytes | str | None) -> dict[str, Any]:
    if raw is None or (isinstance(raw, (bytes, str)) and not raw.strip()):
        return {}
    try:
        params = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        raise InvalidRequest("params", f"is not valid JSON ({e})") from None
    if not isinstance(params, dict):
        raise InvalidRequest("params", f"must be a JSON object, got {type(params).__name__}")
    return params


class TTSAdapter:
    """Validates a request for one model type and builds stage 0's inputs.

    Subclasses list their `params`; `context` carries what the loaded model knows (speakers,
    languages) so validation matches the checkpoint actually served.
    """
    name = ""
    params: tuple[Param, ...] = ()

    def __init__(self, context: dict[str, Any] | None = None):
        self.context = context or {}

    @classmethod
    def from_model(cls, model_path: str | None) -> "TTSAdapter":
        """An adapter for the checkpoint being served (reads only its config, no weights)."""
        return cls()

    def param_specs(self) -> dict[str, Param]:
        return {p.name: p for p in self.params}

    def validate(self, text: bytes | str, params: bytes | str | dict | None) -> dict[str, Any]:
        """Return the normalized request {"text": ..., **params}; raise InvalidRequest."""
        text = decode_text(text)
        raw = params if isinstance(params, dict) else decode_params(params)
        specs = self.param_specs()
        for k in raw:
            if k not in specs:
                raise InvalidRequest(k, f"unknown parameter; allowed: {', '.join(sorted(specs))}")
        out = {name: spec.check(raw.get(name)) for name, spec in specs.items()}
        out = self.check(text, out)
        out["text"] = text
        return out

    def check(self, text: str, params: dict[str, Any]) -> dict[str, Any]:
        """Model-specific cross-field rules; override."""
        return params


_ADAPTERS: dict[str, type[TTSAdapter]] = {}


def register_adapter(cls: type[TTSAdapter]) -> type[TTSAdapter]:
    _ADAPTERS[cls.name] = cls
    return cls


def adapter_class(model_type: str) -> type[TTSAdapter]:
    _load_builtin()
    try:
        return _ADAPTERS[model_type]
    except KeyError:
        raise KeyError(f"no adapter for model type {model_type!r}; known: {', '.join(sorted(_ADAPTERS))}") from None


def _load_builtin() -> None:
    from omni_backend.adapters import hibari, qwen3_tts  # noqa: F401


