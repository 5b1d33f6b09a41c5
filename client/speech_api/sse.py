"""Server-sent events for `stream_format: "sse"`, OpenAI's event shapes.

`speech.audio.delta` carries base64 audio in the requested response_format, in order;
`speech.audio.done` closes the stream with usage; `speech.audio.error` replaces it when the
stream fails after the status line went out.
"""
from __future__ import annotations

import base64
import json
import math
import re
from typing import Any

CONTENT_TYPE = "text/event-stream"
# Usage is reported in the units OpenAI uses: input_tokens approximates text tokens (words and
# punctuation marks), output_tokens counts audio frames at 12.5 per second (a 12.5 Hz codec's
# frame rate), so both grow with the work a request costs.
AUDIO_TOKENS_PER_SECOND = 12.5
_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def delta(audio: bytes) -> bytes:
    return event({"type": "speech.audio.delta", "audio": base64.b64encode(audio).decode()})


def usage(text: str, audio_seconds: float) -> dict[str, int]:
    inp = len(_TOKEN.findall(text))
    out = int(math.ceil(audio_seconds * AUDIO_TOKENS_PER_SECOND))
    return {"input_tokens": inp, "output_tokens": out, "total_tokens": inp + out}


def done(text: str, audio_seconds: float) -> bytes:
    return event({"type": "speech.audio.done", "usage": usage(text, audio_seconds)})


def error(payload: dict[str, Any]) -> bytes:
    return event(payload)
