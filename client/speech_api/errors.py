"""Errors in OpenAI's envelope: `{"error": {"message", "type", "param", "code"}}`.

Every failure the shim answers goes through `ApiError`, so a client never sees FastAPI's 422 or a
bare text body. Triton's typed error messages map onto the same envelope (`from_triton`):

| Triton message                    | HTTP | type                  | code                |
|-----------------------------------|------|-----------------------|---------------------|
| `invalid_request: <field>: ...`   | 400  | invalid_request_error | invalid_value       |
| `unavailable: busy: ...`          | 429  | rate_limit_error      | rate_limit_exceeded |
| `unavailable: ...` (any other)    | 503  | server_error          | service_unavailable |
| `internal: ...`                   | 500  | server_error          | internal_error      |

Triton's own messages carry no code; `omni_backend.errors.with_code` gives them one first (a dead
stub, a stopping server, a model being unloaded are `unavailable`; anything unknown `internal`).
429 and 503 carry Retry-After.
"""
from __future__ import annotations

import json
from typing import Any

from omni_backend.adapters.base import shown
from omni_backend.errors import is_busy, with_code

# Triton's request fields -> the OpenAI fields a client sent.
_FIELD_NAMES = {"text": "input", "params": None}


class ApiError(Exception):
    """One HTTP error answer: status, OpenAI type/code, the offending parameter, extra headers."""

    def __init__(self, status: int, message: str, *, type: str, code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = dict(headers or {})

    def envelope(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}

    def body(self) -> bytes:
        return json.dumps(self.envelope()).encode()

    def sse_event(self) -> dict[str, Any]:
        """The same error as a `speech.audio.error` SSE event (after the status line went out)."""
        return {"type": "speech.audio.error", **self.envelope()}


def invalid_request(param: str | None, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, type="invalid_request_error", code=code, param=param)


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, type="invalid_request_error", code="invalid_api_key",
                    headers={"www-authenticate": "Bearer"})


def model_not_found(model: str, known: list[str]) -> ApiError:
    listing = ", ".join(known) if known else "none are loaded"
    return ApiError(404, f"The model {shown(model)} does not exist; available: {listing}",
                    type="invalid_request_error", code="model_not_found", param="model")


def not_found(path: str) -> ApiError:
    return ApiError(404, f"No route for {path}", type="invalid_request_error", code="not_found")


def retry_headers(seconds: float) -> dict[str, str]:
    secs = max(1, int(round(seconds)))
    return {"retry-after": str(secs), "retry-after-ms": str(int(seconds * 1000))}


def too_many_streams(message: str, retry_after_s: float = 1.0) -> ApiError:
    return ApiError(429, message, type="rate_limit_error", code="rate_limit_exceeded",
                    headers=retry_headers(retry_after_s))


def no_backend(message: str, retry_after_s: float = 2.0) -> ApiError:
    return ApiError(503, message, type="server_error", code="service_unavailable",
                    headers=retry_headers(retry_after_s))


def internal(message: str) -> ApiError:
    return ApiError(500, message, type="server_error", code="internal_error")


def from_triton(message: str) -> ApiError:
    """Map a Triton error response onto the HTTP answer a client expects (table above)."""
    message = with_code(message)
    head, _, rest = message.partition(":")
    code = head.strip()
    rest = rest.strip()
    if code == "invalid_request":
        field, sep, detail = rest.partition(":")
        field = field.strip()
        if sep and field and " " not in field:
            param = _FIELD_NAMES.get(field, field)
            return invalid_request(param, f"{param or field}: {detail.strip()}" if param else rest)
        return invalid_request(None, rest)
    if code == "unavailable":
        if is_busy(message):
            return too_many_streams(rest.removeprefix("busy:").strip() or "the pipeline is busy; retry shortly")
        return no_backend(rest or "Triton cannot serve the model now; retry shortly")
    return internal(rest or message)
