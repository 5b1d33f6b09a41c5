"""Typed errors. Their messages start with a stable code that clients map to HTTP statuses:
`invalid_request:` -> 400, `unavailable:` -> 429/503, `internal:` -> 500."""
from __future__ import annotations


class PipelineError(Exception):
    code = "internal"

    def __init__(self, message: str):
        super().__init__(f"{self.code}: {message}")


class InvalidRequest(PipelineError):
    code = "invalid_request"

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


class Unavailable(PipelineError):
    code = "unavailable"


class Cancelled(Exception):
    """The client went away; the stream ends quietly."""


def error_code(message: str) -> str:
    """The stable code at the start of an error message (`internal` when there is none)."""
    head = message.split(":", 1)[0].strip()
    return head if head in ("invalid_request", "unavailable", "internal") else "internal"
