"""`POST /v1/audio/speech/batch` (vLLM-Omni's): several texts in one request, answered together as
JSON with each item's whole audio in base64.

The body holds `items` (1..32 objects, each with its `input`) and the fields every item shares
(those of `POST /v1/audio/speech` but `input`, `stream` and `stream_format`); an item's own fields
win over the shared ones, and `response_format` defaults to wav. A bad batch (no items, too many, a
model that is not served) is a 400 or 404 for the whole request; a bad or failed item is an
`error` result of its own while the others are spoken. Items run at most `MAX_CONCURRENT_ITEMS`
at a time, each through the same admission as a single request.
"""
from __future__ import annotations

import asyncio
import base64
import uuid
from typing import Any, Awaitable, Callable

from client.speech_api.errors import ApiError, invalid_request

MAX_ITEMS = 32
MAX_CONCURRENT_ITEMS = 4
NOT_SHARED = ("input", "stream", "stream_format")   # per item, or not for a batch at all
NOT_PER_ITEM = ("model", "items", "stream", "stream_format")


def batch_items(body: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The shared fields and each item's whole speech body (`stream: false`); 400 naming the field."""
    if not isinstance(body, dict):
        raise invalid_request(None, "The request body must be a JSON object")
    items = body.get("items")
    if not isinstance(items, list) or not items:
        raise invalid_request("items", "items: required, a list of 1.." f"{MAX_ITEMS} objects with an input",
                              code="missing_required_parameter" if items is None else "invalid_value")
    if len(items) > MAX_ITEMS:
        raise invalid_request("items", f"items: {len(items)} items; at most {MAX_ITEMS} per batch")
    for name in NOT_SHARED:
        if name in body:
            raise invalid_request(name, f"{name}: not a batch field (a batch answers each item whole, as JSON)")
    shared = {k: v for k, v in body.items() if k != "items" and v is not None}
    bodies = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise invalid_request(f"items[{i}]", f"items[{i}]: must be an object with an input")
        for name in NOT_PER_ITEM:
            if name in item:
                raise invalid_request(f"items[{i}].{name}", f"items[{i}].{name}: set for the whole batch only"
                                      if name == "model" else f"items[{i}].{name}: not an item field")
        merged = {**shared, **{k: v for k, v in item.items() if v is not None}}
        merged.setdefault("response_format", "wav")
        bodies.append({**merged, "stream": False})
    return shared, bodies


async def run_batch(bodies: list[dict[str, Any]],
                    speak: Callable[[int, dict[str, Any]], Awaitable[tuple[bytes, str]]]) -> dict[str, Any]:
    """Each item through `speak(index, body) -> (audio bytes, media type)`, at most
    MAX_CONCURRENT_ITEMS at once; an ApiError is that item's error result."""
    gate = asyncio.Semaphore(MAX_CONCURRENT_ITEMS)

    async def one(i: int, body: dict[str, Any]) -> dict[str, Any]:
        async with gate:
            try:
                data, media = await speak(i, body)
            except ApiError as e:
                return {"index": i, "status": "error", "error": e.message, "code": e.code, "param": e.param}
        return {"index": i, "status": "success", "audio_data": base64.b64encode(data).decode("ascii"),
                "media_type": media}

    results = await asyncio.gather(*(one(i, body) for i, body in enumerate(bodies)))
    succeeded = sum(r["status"] == "success" for r in results)
    return {"id": f"speech-batch-{uuid.uuid4().hex}", "object": "speech.batch", "results": results,
            "total": len(results), "succeeded": succeeded, "failed": len(results) - succeeded}
