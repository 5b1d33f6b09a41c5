"""Typed errors. Their messages start with a stable code that clients map to HTTP statuses:
`invalid_request:` -> 400, `unavailable:` -> 429 (`unavailable: busy: ...`, a pipeline at its
stream limit) or 503 (shutting down, restarting, a stage down), `internal:` -> 500.

Triton's own failures (a dead stub, a model being unloaded, a server that is stopping) carry no
code; `with_code` gives them one, so every error a client sees starts with a stable code."""
from __future__ import annotations

CODES = ("invalid_request", "unavailable", "internal")

# Triton's own messages (never ours) that mean "this model cannot serve now, retry", not a bug.
TRITON_UNAVAILABLE = (
    "is not healthy",                 # a stub process that died or stopped answering
    "Server is stopping",             # SIGTERM: schedulers stopped accepting requests
    "stopped accepting",
    "has no available versions",      # a model being unloaded or reloaded
    "is not ready",
    "Server not ready",
    "Server exiting",
    "unknown model",
    "is not found",
    "Socket closed",                  # gRPC channel torn down by a server that is going away
    "failed to connect",
)


class PipelineError(Exception):
    code = "internal"

    def __init__(self, message: str):
        super().__init__(f"{self.code}: {message}")


class InvalidRequest(PipelineError):
    code = "invalid_request"

    def __init__(self, field: str, message: str):
        self.field = field
        self.reason = message
        super().__init__(f"{field}: {message}")


class PromptTooLongError(InvalidRequest, ValueError):
    """A prompt that leaves an engine no cache position for a frame (``field`` is ``input``); a
    stage may name its own field instead (the conversation, a recording)."""


class Unavailable(PipelineError):
    """The pipeline cannot take the request now; `busy` means "at its stream limit" (429)."""

    code = "unavailable"

    def __init__(self, message: str, busy: bool = False):
        super().__init__(f"busy: {message}" if busy else message)


class Cancelled(Exception):
    """The client went away; the stream ends quietly."""


def error_code(message: str) -> str:
    """The stable code of an error message: its own prefix, `unavailable` for Triton's messages
    that mean a model cannot serve now, `internal` otherwise."""
    head = message.split(":", 1)[0].strip()
    if head in CODES:
        return head
    if any(marker in message for marker in TRITON_UNAVAILABLE):
        return "unavailable"
    return "internal"


def with_code(message: str) -> str:
    """The message with its stable code in front (unchanged when it already has one)."""
    head = message.split(":", 1)[0].strip()
    return message if head in CODES else f"{error_code(message)}: {message}"


def is_busy(message: str) -> bool:
    """An `unavailable` that means "at capacity, retry shortly" (HTTP 429, not 503)."""
    return message.startswith("unavailable: busy:")
