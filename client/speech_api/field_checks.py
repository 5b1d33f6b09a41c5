"""Checks of request fields that every body of the speech API shares (speech, chat, the
WebSocket's messages): which keys an error may name, the entry model's string rule, and a
pipeline's own validator of a parameter, each failing with an `ApiError` 400 that names the field.
"""
from __future__ import annotations

import re
from typing import Any

from client.speech_api.catalog import PipelineInfo
from client.speech_api.errors import invalid_request
from omni_backend.adapters.base import check_string
from omni_backend.errors import InvalidRequest

# Body keys an error may name as its `param`.
FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def clean_string(name: str, value: str) -> str:
    """The entry model's string rule: a lone surrogate cannot even be encoded for Triton."""
    try:
        check_string(name, value)
    except InvalidRequest as e:
        raise invalid_request(name, str(e).removeprefix("invalid_request: ")) from None
    return value


def check_param(info: PipelineInfo, name: str, value: Any, field: str | None = None) -> Any:
    """Run the adapter's own validator so the 400 comes before any audio is computed; the error
    names the request's `field` (the OpenAI / extension name)."""
    field = field or name
    spec = (info.fields or {}).get(name)
    if spec is None or spec.check is None:
        return value
    try:
        return spec.check(value)
    except Exception as e:  # InvalidRequest from the adapter: "invalid_request: <name>: ..."
        detail = str(e)
        for prefix in ("invalid_request: ", f"{name}: "):
            if detail.startswith(prefix):
                detail = detail[len(prefix):]
        raise invalid_request(field, f"{field}: {detail}") from None
