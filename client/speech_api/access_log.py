"""Request ids and the access log, as plain ASGI middleware (it must not buffer streams).

Every response carries `x-request-id` (the client's own, when it sent a sane one); the same id
goes to Triton as the request id. One log line per request, written when the body is done,
holds the time to the status line, to first audio from Triton (ttfa), to the first body byte,
the total, the bytes sent and the audio seconds. An exception that escapes every handler still
becomes a 500 in the OpenAI envelope, with its request id. A WebSocket session writes one such
line per stream it speaks (`log_request`, method `WS`).
"""
from __future__ import annotations

import logging
import re
import time
import uuid

from client.speech_api.errors import internal

log = logging.getLogger("omni.speech_api.access")
_SANE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def _ms(t: float | None, t0: float) -> str:
    return "-" if t is None else f"{(t - t0) * 1000:.0f}"


def log_request(request_id: str, client: str, method: str, path: str, status: int | None, sent_bytes: int,
                t0: float, start: float | None, first_byte: float | None, end: float, access: dict) -> None:
    """The access line of one request: its times (perf_counter) and the fields its handler left
    in `access` (model, format, ttfa_ms, outcome, ...)."""
    extra = " ".join(f"{k}={v}" for k, v in access.items() if k != "ttfa_ms")
    ttfa = access.get("ttfa_ms")
    log.info('%s %s "%s %s" %s bytes=%d status_ms=%s ttfa_ms=%s ttfb_ms=%s total_ms=%.0f %s',
             request_id, client, method, path, status or "-", sent_bytes, _ms(start, t0),
             "-" if ttfa is None else f"{ttfa:.0f}", _ms(first_byte, t0), (end - t0) * 1000, extra)


class AccessLogMiddleware:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"x-request-id", b"").decode("latin-1")
        request_id = given if _SANE_ID.match(given) else uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        access: dict = {}
        state["access"] = access
        t0 = time.perf_counter()
        marks = {"status": None, "start": None, "first_byte": None, "bytes": 0}

        async def send_wrapper(message) -> None:
            if message["type"] == "http.response.start":
                marks["status"] = message["status"]
                marks["start"] = time.perf_counter()
                message = dict(message)
                message["headers"] = [*message.get("headers", []),
                                      (b"x-request-id", request_id.encode("latin-1"))]
            elif message["type"] == "http.response.body" and message.get("body"):
                if marks["first_byte"] is None:
                    marks["first_byte"] = time.perf_counter()
                marks["bytes"] += len(message["body"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except Exception as e:
            if marks["status"] is not None:
                raise
            log.exception("%s: unhandled error", request_id)
            error = internal(f"{type(e).__name__}: {e}")
            await send_wrapper({"type": "http.response.start", "status": error.status,
                                "headers": [(b"content-type", b"application/json")]})
            await send_wrapper({"type": "http.response.body", "body": error.body()})
        finally:
            client = scope.get("client") or ("-", 0)
            log_request(request_id, client[0], scope.get("method"), scope.get("path"), marks["status"],
                        marks["bytes"], t0, marks["start"], marks["first_byte"], time.perf_counter(), access)
